"""Once no GPU is wholly free, the walk passes over the fractions that no partly used GPU
of their model has the compute for, and decides exactly what the plain walk decides."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from scheduler.core.model import GpuState, NodeState, PendingJob, RunningJob, Snapshot, TeamState
from scheduler.policies import get_policy
from scheduler.policies.base import Cycle


def _with(snapshot: Snapshot, **extra: object) -> Snapshot:
    return replace(snapshot, settings=MappingProxyType({**snapshot.settings, **extra}))


def _shared_gpus_nearly_full(pending: int = 60) -> Snapshot:
    """Two nodes with every GPU busy but one shared A100 with 20 % compute free. An 8-GPU
    job first in line reserves a node; behind it 50 % fractions that fit nowhere, one 10 %
    fraction at position 20 that fits the A100, and one at position 40 that asks for an
    H100 (none has room)."""
    busy = tuple(GpuState(i, "A100", 81920, 0, 0) for i in range(8))
    shared = tuple(
        GpuState(i, "A100", 81920, *((40960, 20) if i == 0 else (0, 0))) for i in range(8)
    )
    running = (
        RunningJob(1, "vision", "ada", "a", tuple(range(8)), 0.0, 70_000.0, gpus=8),
        RunningJob(2, "nlp", "bob", "b", tuple(range(1, 8)), 0.0, 50_000.0, gpus=7),
        RunningJob(
            3, "nlp", "bob", "b", (0,), 0.0, 90_000.0, gpus=0, gpu_memory_mb=40960,
            gpu_compute_percent=80,
        ),
    )  # fmt: skip
    jobs = [PendingJob(800, "vision", "ada", 0.0, 90_000.0, gpus=8, priority=900)]
    for k in range(pending):
        compute, model = (10, "H100") if k == 40 else (10, None) if k == 20 else (50, None)
        jobs.append(
            PendingJob(
                100 + k, "nlp", "cy", float(k), 90_000.0, gpus=0, gpu_memory_mb=4096,
                gpu_compute_percent=compute, gpu_model=model,
            )
        )  # fmt: skip
    return Snapshot(
        now=40_000.0,
        nodes=(NodeState("a", busy), NodeState("b", shared)),
        running=running,
        pending=tuple(jobs),
        teams=MappingProxyType({"vision": TeamState("vision"), "nlp": TeamState("nlp")}),
    )


@pytest.mark.parametrize("name", ["priority", "backfill"])
@pytest.mark.parametrize("extra", [{}, {"explain": False, "plan_waits": False}])
def test_fractions_without_room_are_passed_over(name, extra, monkeypatch) -> None:
    snapshot = _with(_shared_gpus_nearly_full(), **extra)
    reference = get_policy(name).schedule(_with(snapshot, fast_paths=False))
    considered = []
    original = Cycle.consider

    def spy(self, job):
        considered.append(job.id)
        return original(self, job)

    monkeypatch.setattr(Cycle, "consider", spy)
    fast = get_policy(name).schedule(snapshot)
    if extra.get("plan_waits", True):
        assert fast == reference
    else:  # the order stops where the walk settled
        assert replace(fast, order=()) == replace(reference, order=())
    assert [p.job_id for p in reference.places] == [120]
    assert [r.job_id for r in reference.reserves] == [800]
    assert considered == [800, 120]
