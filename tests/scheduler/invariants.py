"""Invariants every policy's plan must keep, for property tests of any policy.

`plan_violations(snapshot, plan)` lists what is wrong (empty when the plan is sound);
`assert_plan_valid` fails a test with that list. Capacity is checked from the snapshot's
GPU states, which already net out running jobs, with the plan's placements on top; host
CPUs and memory likewise from each node's free amounts. A multi-node gang must have one
member per node it spans, each on its own node with its share of GPUs, all of one kind
(and in one topology group when it says same_group).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from scheduler.core.model import FULL_COMPUTE, NodeState, PendingJob, Plan, Snapshot

_EPS = 1e-9


def plan_violations(snapshot: Snapshot, plan: Plan, *, full_order: bool = True) -> list[str]:
    problems: list[str] = []
    pending = {j.id: j for j in snapshot.pending}
    running = {r.id: r for r in snapshot.running}
    nodes = {n.name: n for n in snapshot.nodes}

    placed_ids = [p.job_id for p in plan.places]
    wait_ids = [w.job_id for w in plan.waits]
    for job_id, n in Counter(placed_ids).items():
        if n > 1:
            problems.append(f"job {job_id} placed {n} times")
    for job_id, n in Counter(wait_ids).items():
        if n > 1:
            problems.append(f"job {job_id} has {n} waits")
    for job_id in set(placed_ids) & set(wait_ids):
        problems.append(f"job {job_id} both placed and waiting")
    for job_id in set(placed_ids) | set(wait_ids):
        if job_id not in pending:
            problems.append(f"plan speaks of job {job_id}, which is not pending")
    for job_id in pending:
        if job_id not in placed_ids and job_id not in wait_ids:
            problems.append(f"pending job {job_id} neither placed nor waiting")
    for wait in plan.waits:
        if not wait.reason:
            problems.append(f"job {wait.job_id} waits without a reason")
    if len(set(plan.order)) != len(plan.order):
        problems.append("order lists a job twice")
    if full_order and set(plan.order) != set(pending):
        problems.append("order is not exactly the pending jobs")

    # Capacity: (memory, compute, wholly taken) per GPU after placements.
    used: dict[tuple[str, int], list] = {}
    host_used: dict[str, list[int]] = {}
    for place in plan.places:
        job = pending.get(place.job_id)
        if job is None:
            continue
        members = place.allocations
        if len(members) != job.nodes:
            problems.append(f"job {job.id} spans {job.nodes} nodes, placed on {len(members)}")
        if len({m.node for m in members}) != len(members):
            problems.append(f"job {job.id} has two members on one node")
        kinds: set[tuple[str, int]] = set()
        groups = set()
        for member in members:
            node = nodes.get(member.node)
            if node is not None:
                kinds.update(
                    (g.model, g.memory_mb) for g in node.gpus if g.index in member.gpu_indices
                )
                groups.add(node.group)
            problems += _member_violations(job, member.node, member.gpu_indices, node, used)
            if node is not None:
                slot = host_used.setdefault(member.node, [0, 0])
                slot[0] += job.cpus
                slot[1] += job.memory_mb
        if job.gpus and len(kinds) > 1:
            problems.append(f"job {job.id} mixes GPU kinds {sorted(kinds)}")
        if job.same_group and len(members) > 1 and (len(groups) != 1 or "" in groups):
            problems.append(f"job {job.id} must share one group, got {sorted(groups)}")
    for node_name, (cpus, memory_mb) in host_used.items():
        node = nodes[node_name]
        if node.free_cpus is not None and cpus > node.free_cpus:
            problems.append(f"node {node_name} CPUs over-committed: {cpus} > {node.free_cpus}")
        if node.free_memory_mb is not None and memory_mb > node.free_memory_mb:
            problems.append(
                f"node {node_name} host memory over-committed: {memory_mb} > {node.free_memory_mb}"
            )
    problems += _gpu_violations(nodes, used)
    problems += _quota_violations(snapshot, plan, pending)

    for job_id, n in Counter(p.job_id for p in plan.preempts).items():
        if n > 1:
            problems.append(f"job {job_id} preempted {n} times")
    for pre in plan.preempts:
        victim = running.get(pre.job_id)
        if victim is None:
            problems.append(f"preempts job {pre.job_id}, which is not running")
        elif not victim.preemptible:
            problems.append(f"preempts job {pre.job_id}, which is not preemptible")
        elif pre.requeue and not victim.requeueable:
            problems.append(f"requeues job {pre.job_id}, which has no requeue left")
    for res in plan.reserves:
        if res.job_id not in pending or res.job_id in placed_ids:
            problems.append(f"reservation for job {res.job_id}, which is not waiting")
        if res.start < snapshot.now - _EPS:
            problems.append(f"reservation for job {res.job_id} starts in the past")
        job = pending.get(res.job_id)
        held = [res.node, *(m.node for m in res.members)]
        if job is not None and job.gpus and len(held) != job.nodes:
            problems.append(f"reservation for job {res.job_id} holds {len(held)} nodes")
        if len(set(held)) != len(held):
            problems.append(f"reservation for job {res.job_id} holds a node twice")
    return problems


def _member_violations(
    job: PendingJob, node_name: str, indices: tuple[int, ...], node: NodeState | None, used: dict
) -> list[str]:
    """One member's GPUs: on a schedulable node, the right count and kind; adds its use."""
    problems: list[str] = []
    if node is None or not node.schedulable:
        return [f"job {job.id} placed on unschedulable or unknown node {node_name}"]
    gpus = {g.index: g for g in node.gpus}
    if job.gpus:
        per = job.gpus_on_each_node
        if len(indices) != per or len(set(indices)) != per:
            problems.append(f"job {job.id} needs {per} GPUs on {node_name}, got {indices}")
    elif len(indices) != 1:
        problems.append(f"fractional job {job.id} placed on {indices}")
    for idx in indices:
        gpu = gpus.get(idx)
        if gpu is None:
            problems.append(f"job {job.id} placed on missing GPU {node_name}/{idx}")
            continue
        if job.gpu_model is not None and gpu.model != job.gpu_model:
            problems.append(f"job {job.id} wants {job.gpu_model}, got {gpu.model}")
        if job.min_gpu_memory_mb is not None and gpu.memory_mb < job.min_gpu_memory_mb:
            problems.append(f"job {job.id} wants >= {job.min_gpu_memory_mb} MB GPU")
        slot = used.setdefault((node_name, idx), [0, 0, 0])
        if job.gpus:
            slot[2] += 1
        else:
            slot[0] += job.gpu_memory_mb or 0
            slot[1] += job.gpu_compute_percent or 0
    return problems


def _gpu_violations(nodes: dict[str, NodeState], used: dict) -> list[str]:
    problems: list[str] = []
    for (node_name, idx), (mem, comp, whole) in used.items():
        gpu = {g.index: g for g in nodes[node_name].gpus}[idx]
        where = f"{node_name}/{idx}"
        if whole:
            if whole > 1 or mem or comp:
                problems.append(f"GPU {where} shared by a whole-GPU job")
            if gpu.free_compute_percent < FULL_COMPUTE or gpu.free_memory_mb < gpu.memory_mb:
                problems.append(f"whole-GPU job on busy GPU {where}")
        if mem > gpu.free_memory_mb:
            problems.append(f"GPU {where} memory over-committed: {mem} > {gpu.free_memory_mb}")
        if comp > gpu.free_compute_percent:
            problems.append(
                f"GPU {where} compute over-committed: {comp} > {gpu.free_compute_percent}"
            )
    return problems


def _quota_violations(snapshot: Snapshot, plan: Plan, pending: dict) -> list[str]:
    problems: list[str] = []
    # Quotas: running plus placed, per team (hard limit) and per user (cap).
    team_use: defaultdict[str, float] = defaultdict(float)
    user_use: defaultdict[tuple[str, str], float] = defaultdict(float)
    for r in snapshot.running:
        team_use[r.team] += r.gpu_equivalent
        user_use[(r.team, r.user)] += r.gpu_equivalent
    base_team, base_user = team_use.copy(), user_use.copy()
    for place in plan.places:
        job = pending.get(place.job_id)
        if job is not None:
            team_use[job.team] += job.gpu_equivalent
            user_use[(job.team, job.user)] += job.gpu_equivalent
    for slug, team in snapshot.teams.items():
        added = team_use[slug] - base_team[slug]
        if team.hard_limit_gpus is not None and added > _EPS:
            if team_use[slug] > team.hard_limit_gpus + _EPS:
                problems.append(f"team {slug} over its hard limit: {team_use[slug]}")
        if team.user_gpu_cap is not None:
            for (t, user), value in user_use.items():
                if t == slug and value - base_user[(t, user)] > _EPS:
                    if value > team.user_gpu_cap + _EPS:
                        problems.append(f"user {user} of {slug} over the cap: {value}")
    return problems


def assert_plan_valid(snapshot: Snapshot, plan: Plan, *, full_order: bool = True) -> None:
    problems = plan_violations(snapshot, plan, full_order=full_order)
    assert not problems, f"{plan.policy}: " + "; ".join(problems)
