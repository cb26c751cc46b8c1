"""What an agent sees and can do: the queue head, free capacity, best-fit placement.

Shared by the Gymnasium environment and the baseline driver, so a policy trained in the
environment acts the same way when the simulator runs it. Plain numpy, no gymnasium.
"""

from __future__ import annotations

import math

import numpy as np

from scheduler.core.model import Member
from scheduler.sim.jobs import JobSpec
from scheduler.sim.state import SimState

JOB_FEATURES = 5  # present, gpus share of a node, log expected runtime, log wait, fits now
LOG_SCALE = 15.0  # log1p(seconds) / 15 keeps a 30-day job under 1


def queue_head(state: SimState, k: int) -> list[int]:
    """The first k pending job ids in submit order (the order jobs entered the queue)."""
    out = []
    for job_id in state.pending:
        out.append(job_id)
        if len(out) == k:
            break
    return out


def expected_runtime(state: SimState, job_id: int) -> float:
    """What the scheduler may know: the prediction, else the time limit (never the truth)."""
    return state.pending[job_id].expected_runtime


def best_fit(
    state: SimState, spec: JobSpec
) -> tuple[str, tuple[int, ...], tuple[Member, ...]] | None:
    """Where the job goes now: (node, GPU indices, further members), or None when it does
    not fit. Each member takes the node with the fewest wholly free GPUs that still holds it
    (a fraction takes a whole GPU here), respecting the GPU model and host CPUs/memory; a
    multi-node gang takes that many such nodes."""
    want = spec.gpus_on_each_node or 1
    k = spec.nodes
    fits: list[tuple[int, int]] = []
    for pos, node in enumerate(state.cluster.nodes):
        free = state.free_whole[node.name]
        if free < want or (spec.gpu_model and node.model != spec.gpu_model):
            continue
        if not state.host_room(spec, node.name):
            continue
        fits.append((free, pos))
        if k == 1 and free == want:
            break
    if len(fits) < k:
        return None
    fits.sort()
    names = [state.cluster.nodes[pos].name for _, pos in fits[:k]]
    members = tuple(Member(n, tuple(state.whole_free_indices(n)[:want])) for n in names)
    return members[0].node, members[0].gpu_indices, members[1:]


def observe(state: SimState, head: list[int]) -> np.ndarray:
    """Flat float32 vector: K rows of job features, then capacity features
    (free share of the cluster, largest free block / node size, nodes by free count)."""
    k = len(head)
    max_node = state.cluster.max_node_gpus
    jobs = np.zeros((k, JOB_FEATURES), dtype=np.float32)
    for row, job_id in enumerate(head):
        spec = state.jobs[job_id].spec
        jobs[row] = (
            1.0,
            (spec.gpus or 1) / max_node,
            math.log1p(expected_runtime(state, job_id)) / LOG_SCALE,
            math.log1p(max(0.0, state.now - spec.submit)) / LOG_SCALE,
            float(best_fit(state, spec) is not None),
        )
    return np.concatenate([jobs.ravel(), capacity(state)])


def capacity(state: SimState) -> np.ndarray:
    max_node = state.cluster.max_node_gpus
    hist = np.zeros(max_node + 1, dtype=np.float32)
    for free in state.free_whole.values():
        hist[free] += 1
    hist /= max(1, len(state.free_whole))
    free_total = sum(state.free_whole.values())
    largest = max(state.free_whole.values(), default=0)
    head = np.array([free_total / max(1, state.total_gpus), largest / max_node], np.float32)
    return np.concatenate([head, hist])


def obs_size(k: int, max_node_gpus: int) -> int:
    return k * JOB_FEATURES + 2 + max_node_gpus + 1
