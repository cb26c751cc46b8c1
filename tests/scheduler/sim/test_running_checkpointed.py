"""What the simulator tells policies of a running job's checkpoints: the job's own
`checkpointed` (a trace column), None where the trace leaves it to the run."""

from __future__ import annotations

from scheduler.sim.cluster import parse_cluster
from scheduler.sim.state import SimConfig, SimState

from .conftest import job

THREE_GPUS = parse_cluster("1x3xV100")


def test_running_jobs_carry_the_specs_checkpointed() -> None:
    specs = [job(1, 0, 100, checkpointed=True), job(2, 0, 100, checkpointed=False), job(3, 0, 100)]
    state = SimState(specs, THREE_GPUS, SimConfig(checkpointing=True))
    node = THREE_GPUS.nodes[0].name
    state.advance(0)
    for i in (1, 2, 3):
        assert state.start(i, node, (i - 1,)) is None
    running = {r.id: r.checkpointed for r in state.snapshot().running}
    assert running == {1: True, 2: False, 3: None}
