"""The jobs the walk records at once as only waiting (runs) get the Waits the plain walk
gives them: the same sentences, quota answers and order.

A run's jobs are explained in bulk: a job alike in request_key to an earlier one that
waits for room shares its sentence, and a job alike in FLEET_FIELDS shares its fleet
check; both hold only while those fields are all the checks read.
"""

from __future__ import annotations

from dataclasses import fields
from types import MappingProxyType, SimpleNamespace
from unittest.mock import patch

import pytest
from hypothesis import given

from scheduler.core.admission import FLEET_FIELDS, FleetProfile
from scheduler.core.model import (
    GpuState,
    NodeState,
    PendingJob,
    RunningJob,
    Snapshot,
    TeamState,
    Wait,
)
from scheduler.core.placement import FreeCapacity
from scheduler.policies import get_policy, walk
from scheduler.policies.base import Cycle
from scheduler.policies.cycle_waits import _waits_of
from scheduler.policies.walk import ROOM_FIELDS
from tests.scheduler.policies.strategies import (
    CYCLE_CHECKS,
    WALKING_POLICIES,
    busy_snapshots,
    with_settings,
)


@pytest.mark.parametrize("name", WALKING_POLICIES)
@CYCLE_CHECKS
@given(snapshot=busy_snapshots())
def test_runs_of_any_length_give_the_plain_waits(name: str, snapshot: Snapshot) -> None:
    reference = get_policy(name).schedule(with_settings(snapshot, fast_paths=False))
    with patch.object(walk, "_RUN", 1), patch.object(walk, "_WINDOW", 1):
        assert get_policy(name).schedule(snapshot) == reference


def _full_fleet_with_caps(pending: int = 40) -> Snapshot:
    """One 8-GPU node with 2 GPUs free; a queue of 4-GPU jobs that cannot start, from two
    users of a team whose per-user cap one of them has reached."""
    gpus = tuple(GpuState(i, "A100", 81920, *((81920, 100) if i < 2 else (0, 0))) for i in range(8))
    running = (RunningJob(1, "nlp", "bob", "a", tuple(range(2, 8)), 0.0, 60_000.0, gpus=6),)
    jobs = [
        PendingJob(100 + k, "nlp", ("bob", "cy")[k % 2], float(k), 600.0, gpus=4)
        for k in range(pending)
    ]
    return Snapshot(
        now=40_000.0,
        nodes=(NodeState("a", gpus),),
        running=running,
        pending=tuple(jobs),
        teams=MappingProxyType({"nlp": TeamState("nlp", user_gpu_cap=8)}),
    )


@pytest.mark.parametrize("name", ["priority", "sjf", "backfill"])
def test_run_with_jobs_held_by_quota(name: str) -> None:
    snapshot = _full_fleet_with_caps()
    reference = get_policy(name).schedule(with_settings(snapshot, fast_paths=False))
    assert get_policy(name).schedule(snapshot) == reference
    reasons = {w.job_id: w.reason for w in reference.waits}
    assert reasons[133].startswith("needs 4 GPUs on one node")  # cy: no room
    assert reasons[132].startswith("user bob uses 6 of the per-user cap of 8 GPUs")


@pytest.mark.parametrize("name", ["priority", "backfill"])
@CYCLE_CHECKS
@given(snapshot=busy_snapshots())
def test_runs_from_kept_rows_give_the_plain_waits(name: str, snapshot: Snapshot) -> None:
    """The second cycle on the same job objects reads the queue from the rows kept
    across cycles (its team columns among them)."""
    reference = get_policy(name).schedule(with_settings(snapshot, fast_paths=False))
    policy = get_policy(name)
    with patch.object(walk, "_RUN", 1), patch.object(walk, "_WINDOW", 1):
        policy.schedule(snapshot)
        assert policy.schedule(snapshot) == reference


def test_a_reason_given_later_replaces_the_recorded_wait() -> None:
    snapshot = _full_fleet_with_caps()
    cycle = Cycle(snapshot, "test")
    cycle.consider_all(list(snapshot.pending))
    assert any(held for _, _, held in cycle._room_runs)  # bob's jobs in a run, by quota
    cycle.wait(snapshot.pending[30], "held for maintenance")
    reasons = {w.job_id: w.reason for w in cycle.plan().waits}
    assert reasons[130] == "held for maintenance"
    assert reasons[131].startswith("needs 4 GPUs on one node")


def _only(job: PendingJob, names: tuple[str, ...]) -> SimpleNamespace:
    """The job with no field but these (reading any other raises AttributeError)."""
    return SimpleNamespace(**{n: getattr(job, n) for n in names})


JOBS = [
    PendingJob(1, "t", "u", 0.0, 60.0, gpus=16),
    PendingJob(2, "t", "u", 0.0, 60.0, gpus=8, gpus_per_node=4, cpus=8, memory_mb=4096),
    PendingJob(3, "t", "u", 0.0, 60.0, gpus=4, gpu_model="V100", same_group=True),
    PendingJob(4, "t", "u", 0.0, 60.0, gpus=0, gpu_memory_mb=1000, gpu_compute_percent=20),
    PendingJob(5, "t", "u", 0.0, 60.0, gpus=1, min_gpu_memory_mb=100_000),
]


@pytest.mark.parametrize("job", JOBS)
def test_room_sentence_reads_only_the_request_fields(job: PendingJob) -> None:
    assert FreeCapacity.shape(_only(job, ROOM_FIELDS)) == FreeCapacity.shape(job)
    assert "team" in ROOM_FIELDS


@pytest.mark.parametrize("job", JOBS)
def test_fleet_check_reads_only_its_fields(job: PendingJob) -> None:
    gpus = tuple(GpuState(i, "A100", 81920, 81920, 100) for i in range(8))
    profile = FleetProfile((NodeState("a", gpus, cpus=64, memory_mb=1 << 20),))
    assert profile.fleet_error(_only(job, FLEET_FIELDS)) == profile.fleet_error(job)
    assert profile.error(job, None) == profile.fleet_error(job)


def test_waits_built_by_their_slots_are_waits() -> None:
    assert [f.name for f in fields(Wait)] == ["job_id", "reason", "eta"]
    built = _waits_of([7, 8], ["a", "b"])
    assert built == [Wait(7, "a"), Wait(8, "b")]
    assert all(type(w) is Wait and w.eta is None for w in built)
