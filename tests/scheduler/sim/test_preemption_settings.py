"""The simulator tells policies what a preemption costs in its own model."""

from __future__ import annotations

from scheduler.sim.cluster import parse_cluster
from scheduler.sim.state import SimConfig, SimState


def _settings(config: SimConfig):
    return SimState([], parse_cluster("1x8xV100"), config).snapshot().settings


def test_checkpointing_and_restart_overhead_reach_the_policies():
    s = _settings(SimConfig(checkpointing=True, restart_overhead=120.0))
    assert s["preemption_checkpoints"] is True
    assert s["preemption_restart_overhead"] == 120.0
    assert _settings(SimConfig())["preemption_checkpoints"] is False


def test_the_runs_own_settings_win():
    config = SimConfig(checkpointing=True, settings={"preemption_checkpoints": False})
    assert _settings(config)["preemption_checkpoints"] is False
