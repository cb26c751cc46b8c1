"""Invariants every policy's plan must keep, for property tests of any policy.

`plan_violations(snapshot, plan)` lists what is wrong (empty when the plan is sound);
`assert_plan_valid` fails a test with that list. Capacity is checked from the snapshot's
GPU states, which already net out running jobs, with the plan's placements on top.
"""

from __future__ import annotations

from collections import Counter

from scheduler.core.model import FULL_COMPUTE, Plan, Snapshot

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
    for place in plan.places:
        job = pending.get(place.job_id)
        node = nodes.get(place.node)
        if job is None:
            continue
        if node is None or not node.schedulable:
            problems.append(f"job {job.id} placed on unschedulable or unknown node {place.node}")
            continue
        gpus = {g.index: g for g in node.gpus}
        if job.gpus:
            if len(place.gpu_indices) != job.gpus or len(set(place.gpu_indices)) != job.gpus:
                problems.append(f"job {job.id} needs {job.gpus} GPUs, got {place.gpu_indices}")
        elif len(place.gpu_indices) != 1:
            problems.append(f"fractional job {job.id} placed on {place.gpu_indices}")
        for idx in place.gpu_indices:
            gpu = gpus.get(idx)
            if gpu is None:
                problems.append(f"job {job.id} placed on missing GPU {place.node}/{idx}")
                continue
            if job.gpu_model is not None and gpu.model != job.gpu_model:
                problems.append(f"job {job.id} wants {job.gpu_model}, got {gpu.model}")
            if job.min_gpu_memory_mb is not None and gpu.memory_mb < job.min_gpu_memory_mb:
                problems.append(f"job {job.id} wants >= {job.min_gpu_memory_mb} MB GPU")
            slot = used.setdefault((place.node, idx), [0, 0, 0])
            if job.gpus:
                slot[2] += 1
            else:
                slot[0] += job.gpu_memory_mb or 0
                slot[1] += job.gpu_compute_percent or 0
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

    # Quotas: running plus placed, per team (hard limit) and per user (cap).
    team_use: Counter = Counter()
    user_use: Counter = Counter()
    for r in snapshot.running:
        team_use[r.team] += r.gpu_equivalent
        user_use[(r.team, r.user)] += r.gpu_equivalent
    base_team, base_user = Counter(team_use), Counter(user_use)
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
    return problems


def assert_plan_valid(snapshot: Snapshot, plan: Plan, *, full_order: bool = True) -> None:
    problems = plan_violations(snapshot, plan, full_order=full_order)
    assert not problems, f"{plan.policy}: " + "; ".join(problems)
