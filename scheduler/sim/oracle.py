"""srpt-oracle: preemptive shortest-remaining-time-first with exact runtimes.

A reference point for the benchmarks, implemented in the simulator; it is not a production
policy and no production scheduler can run it: it knows every job's true remaining work,
preempts and migrates for free (progress kept, no restart overhead), and re-plans the whole
cluster at every event. A job on one node keeps its node when it still fits there; a
multi-node gang gets one member per node (best fit, within one topology group when one has
room), and keeps its nodes while they still fit. GPU model, host CPU and memory constraints
hold. Fractional jobs are given a whole GPU. It is a strong heuristic, not a proven lower
bound: greedy packing can leave GPUs idle that another choice of jobs would have used, and
with gangs more so (a gang that does not fit is passed over by smaller jobs, which may then
keep it waiting; SRPT order is not optimal for gangs either).
"""

from __future__ import annotations

import math

from scheduler.core.model import Member
from scheduler.sim.jobs import JobSpec
from scheduler.sim.state import SimState


class SrptOracle:
    name = "srpt-oracle"

    def __init__(self) -> None:
        self._seen_events = -1

    def cycle(self, state: SimState) -> int:
        # Remaining times of running jobs only shrink between events, which never changes
        # which jobs SRPT picks; re-plan only when an arrival or completion happened.
        if state.events == self._seen_events:
            return 0
        self._seen_events = state.events
        now = state.now
        specs = state.cluster.nodes
        nodes = [spec.name for spec in specs]
        node_pos = {n: i for i, n in enumerate(nodes)}
        size = [spec.gpus for spec in specs]
        models = [spec.model for spec in specs]
        groups = [spec.group for spec in specs]
        cpus = [math.inf if n.cpus is None else float(n.cpus) for n in specs]
        mem = [math.inf if n.host_memory_mb is None else float(n.host_memory_mb) for n in specs]
        limited = any(n.cpus is not None or n.host_memory_mb is not None for n in specs)
        free = list(size)  # planned free GPUs per node, starting from an empty cluster
        max_size = max(size)
        buckets: list[dict[int, None]] = [{} for _ in range(max_size + 1)]
        for i, f in enumerate(free):
            buckets[f][i] = None
        free_total = sum(free)

        active = []
        for job_id in state.running:
            run = state.jobs[job_id]
            active.append((run.ends_at - now, run.spec.submit, job_id))
        for job_id in state.pending:
            run = state.jobs[job_id]
            active.append((run.remaining_work, run.spec.submit, job_id))
        active.sort()

        plan: dict[int, tuple[int, ...]] = {}  # job id -> node positions, rank order
        for _, _, job_id in active:
            if free_total == 0:
                break
            run = state.jobs[job_id]
            spec = run.spec
            g = spec.gpus_on_each_node or 1
            k = spec.nodes
            if g * k > free_total:
                continue

            def fits(i: int, spec: JobSpec = spec, g: int = g) -> bool:
                return (
                    free[i] >= g
                    and (spec.gpu_model is None or models[i] == spec.gpu_model)
                    and cpus[i] >= spec.cpus
                    and mem[i] >= spec.memory_mb
                )

            chosen: tuple[int, ...] = ()
            if run.state == "running":
                here = tuple(node_pos[m.node] for m in run.members)
                if all(fits(i) for i in here):
                    chosen = here
            if not chosen:
                if k == 1 and not limited and spec.gpu_model is None:
                    for count in range(g, max_size + 1):
                        if buckets[count]:
                            chosen = (next(iter(buckets[count])),)
                            break
                else:
                    chosen = _best_fit([i for i in range(len(nodes)) if fits(i)], k, free, groups)
            if not chosen:
                continue
            for i in chosen:
                del buckets[free[i]][i]
                free[i] -= g
                buckets[free[i]][i] = None
                cpus[i] -= spec.cpus
                mem[i] -= spec.memory_mb
            free_total -= g * k
            plan[job_id] = chosen

        applied = 0
        for job_id in list(state.running):
            run = state.jobs[job_id]
            if plan.get(job_id) != tuple(node_pos[m.node] for m in run.members):
                state.preempt(job_id, free=True, reason="srpt-oracle")
                applied += 1
        for job_id, positions in plan.items():
            run = state.jobs[job_id]
            if run.state != "pending":
                continue
            g = run.spec.gpus_on_each_node or 1
            members = tuple(
                Member(nodes[i], tuple(state.whole_free_indices(nodes[i])[:g])) for i in positions
            )
            why = state.start(job_id, members[0].node, members[0].gpu_indices, members[1:])
            if why:
                state.invalid_decisions.append(f"srpt-oracle place {job_id}: {why}")
            else:
                applied += 1
        return applied


def _best_fit(fits: list[int], k: int, free: list[int], groups: list[str]) -> tuple[int, ...]:
    """k nodes among `fits`, fewest free GPUs first; within one topology group when some
    group has k of them (the one leaving the least free), else across groups."""
    if len(fits) < k:
        return ()
    ranked = sorted(fits, key=lambda i: (free[i], i))
    if k == 1:
        return (ranked[0],)
    by_group: dict[str, list[int]] = {}
    for i in ranked:
        by_group.setdefault(groups[i], []).append(i)
    whole = [members[:k] for name, members in by_group.items() if name and len(members) >= k]
    if whole:
        return tuple(min(whole, key=lambda m: (sum(free[i] for i in m), m)))
    return tuple(ranked[:k])
