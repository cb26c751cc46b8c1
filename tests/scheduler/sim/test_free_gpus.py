"""The node states the simulator shows follow every start and stop, of fractions and whole
GPUs (the GPU states of untouched GPUs are kept)."""

from __future__ import annotations

from scheduler.core.model import FULL_COMPUTE
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.state import SimConfig, SimState

from .conftest import job


def _free(state: SimState) -> dict[tuple[str, int], tuple[int, int]]:
    return {
        (n.name, g.index): (g.free_memory_mb, g.free_compute_percent)
        for n in state.node_states()
        for g in n.gpus
    }


def test_node_states_follow_a_fraction_and_a_whole_gpu():
    cluster = parse_cluster("1x2xV100")
    frac = job(1, 0, 100, gpus=0, gpu_compute_percent=50, gpu_memory_mb=1024)
    whole = job(2, 0, 100, gpus=1)
    state = SimState([frac, whole], cluster, SimConfig())
    state.advance(0)
    node = state.node_states()[0]
    total = node.gpus[0].memory_mb
    untouched = node.gpus[1]
    assert state.start(1, node.name, (0,)) is None
    assert _free(state)[(node.name, 0)] == (total - 1024, FULL_COMPUTE - 50)
    assert state.node_states()[0].gpus[1] is untouched  # kept, not rebuilt
    assert state.start(2, node.name, (1,)) is None
    assert _free(state)[(node.name, 1)] == (0, 0)
    assert state.preempt(1) is None
    assert _free(state)[(node.name, 0)] == (total, FULL_COMPUTE)
    assert state.preempt(2) is None
    assert _free(state) == {
        (node.name, 0): (total, FULL_COMPUTE),
        (node.name, 1): (total, FULL_COMPUTE),
    }
