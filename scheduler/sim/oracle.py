"""srpt-oracle: preemptive shortest-remaining-time-first with exact runtimes.

A reference point for the benchmarks, implemented in the simulator; it is not a production
policy and no production scheduler can run it: it knows every job's true remaining work,
preempts and migrates for free (progress kept, no restart overhead), and re-plans the whole
cluster at every event. Gangs still sit on one node and GPU model constraints hold.
Fractional jobs are given a whole GPU. It is a strong heuristic, not a proven lower bound:
greedy packing can leave GPUs idle that another choice of jobs would have used.
"""

from __future__ import annotations

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
        nodes = [spec.name for spec in state.cluster.nodes]
        node_pos = {n: i for i, n in enumerate(nodes)}
        size = [spec.gpus for spec in state.cluster.nodes]
        models = [spec.model for spec in state.cluster.nodes]
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

        plan: dict[int, int] = {}  # job id -> node position
        for _, _, job_id in active:
            if free_total == 0:
                break
            run = state.jobs[job_id]
            g = run.spec.gpus or 1
            if g > free_total:
                continue
            chosen = -1
            if run.state == "running" and free[node_pos[run.node]] >= g:
                chosen = node_pos[run.node]
            elif run.spec.gpu_model is not None:
                fits = [
                    i for i in range(len(nodes)) if models[i] == run.spec.gpu_model and free[i] >= g
                ]
                if fits:
                    chosen = min(fits, key=lambda i: (free[i], i))
            else:
                for count in range(g, max_size + 1):
                    if buckets[count]:
                        chosen = next(iter(buckets[count]))
                        break
            if chosen < 0:
                continue
            del buckets[free[chosen]][chosen]
            free[chosen] -= g
            buckets[free[chosen]][chosen] = None
            free_total -= g
            plan[job_id] = chosen

        applied = 0
        for job_id in list(state.running):
            run = state.jobs[job_id]
            if plan.get(job_id) != node_pos[run.node]:
                state.preempt(job_id, free=True, reason="srpt-oracle")
                applied += 1
        for job_id, pos in plan.items():
            run = state.jobs[job_id]
            if run.state != "pending":
                continue
            g = run.spec.gpus or 1
            idx = tuple(state.whole_free_indices(nodes[pos])[:g])
            why = state.start(job_id, nodes[pos], idx)
            if why:
                state.invalid_decisions.append(f"srpt-oracle place {job_id}: {why}")
            else:
                applied += 1
        return applied
