"""The release timeline carried across cycles answers as the plain reservation sweep.

`ReleaseTimeline` keeps per-GPU release times of the running jobs between cycles and is
brought up to date by identity (jobs that started or ended); whatever it was fed before,
its answer must be what `earliest_start` gives over the same running jobs and placements.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.model import (
    GpuState,
    NodeState,
    PendingJob,
    RunningChanges,
    RunningJob,
    Snapshot,
)
from scheduler.core.placement import FreeCapacity
from scheduler.core.reservation import (
    Occupant,
    ReleaseTimeline,
    earliest_start,
    occupant_of,
    running_occupants,
)
from tests.scheduler.core import builders
from tests.scheduler.policies.strategies import snapshots

CHECKS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _compare(timeline: ReleaseTimeline, snapshot: Snapshot, now: float, predictions: bool):
    """Place what fits of the queue, then ask both ways for every job that handles."""
    if not timeline.sync(snapshot.running):
        # Nothing carried over (or a job listed twice): the caller sweeps the plain way; a
        # second call with the same objects builds the timeline.
        assert timeline.sync(snapshot.running) == (
            len(set(map(id, snapshot.running))) == len(snapshot.running)
        )
        if not timeline.sync(snapshot.running):
            return 0
    cap = FreeCapacity.from_snapshot(snapshot)
    placed: list[Occupant] = []
    asked = 0
    for job in snapshot.pending:
        if ReleaseTimeline.handles(job, cap):
            occupants = running_occupants(snapshot.running, use_predictions=predictions)
            expected = earliest_start(job, cap, occupants + placed, now)
            assert timeline.earliest_start(job, cap, placed, now) == expected
            asked += 1
        if job.gpus_per_node and job.gpus > job.gpus_per_node:
            continue
        choice = cap.best_fit(job)
        if choice is not None:
            cap.take(job, *choice)
            placed.append(occupant_of(job, choice[0], choice[1], now + job.time_limit))
    return asked


@CHECKS
@given(
    first=snapshots(max_nodes=5, max_pending=12),
    keep=st.lists(st.booleans(), min_size=12, max_size=12),
    later=st.sampled_from([0.0, 3_600.0, 60_000.0, 300_000.0]),
    predictions=st.booleans(),
)
def test_timeline_gives_the_plain_sweep_across_cycles(
    first: Snapshot, keep: list[bool], later: float, predictions: bool
) -> None:
    timeline = ReleaseTimeline(predictions)
    _compare(timeline, first, first.now, predictions)
    # Next cycle: some jobs ended (their objects gone), one came back as a new object with
    # the same id, the clock moved (jobs past their end are overdue).
    running = [r for i, r in enumerate(first.running) if keep[i % len(keep)]]
    if running:
        running[0] = replace(running[0], time_limit=running[0].time_limit + 1.0)
    second = replace(first, running=tuple(running), now=first.now + later)
    _compare(timeline, second, second.now, predictions)
    # And back to the first snapshot's jobs (objects seen before, one of them dropped).
    _compare(timeline, first, first.now + later, predictions)


@CHECKS
@given(snapshot=snapshots(max_nodes=4, max_pending=8))
def test_a_job_listed_twice_is_left_to_the_plain_sweep(snapshot: Snapshot) -> None:
    if not snapshot.running:
        return
    doubled = replace(snapshot, running=(*snapshot.running, snapshot.running[0]))
    timeline = ReleaseTimeline(False)
    _compare(timeline, snapshot, snapshot.now, False)
    _compare(timeline, doubled, doubled.now, False)
    _compare(timeline, snapshot, snapshot.now, False)


def test_new_objects_every_cycle_are_left_to_the_plain_sweep() -> None:
    job = RunningJob(1, "t", "u", "n0", (0, 1), started_at=0.0, time_limit=100.0, gpus=2)
    timeline = ReleaseTimeline(False)
    assert not timeline.sync((job,))
    assert timeline.sync((job,))
    assert timeline.rebuilds == 0
    fresh = replace(job)
    assert not timeline.sync((fresh,))
    assert timeline.rebuilds == 1
    assert timeline.sync((fresh,))


def test_overdue_gpus_are_released_now_in_node_order() -> None:
    """A job past its end and one ending right now both free their GPU now: the sweep
    takes them by node name, as the plain sweep does."""
    now = 1_000.0
    gpu = GpuState(0, "A100", 81920, free_memory_mb=0, free_compute_percent=0)
    nodes = (NodeState("a", (gpu,)), NodeState("b", (gpu,)))
    running = (
        RunningJob(1, "t", "u", "b", (0,), started_at=0.0, time_limit=10.0, gpus=1),
        RunningJob(2, "t", "u", "a", (0,), started_at=0.0, time_limit=now, gpus=1),
    )
    snapshot = Snapshot(now=now, nodes=nodes, running=running)
    cap = FreeCapacity.from_snapshot(snapshot)
    job = PendingJob(3, "t", "u", submitted_at=0.0, time_limit=60.0, gpus=1)
    timeline = ReleaseTimeline(False)
    assert not timeline.sync(running)
    assert timeline.sync(running)
    occupants = running_occupants(running, use_predictions=False)
    assert earliest_start(job, cap, occupants, now) == ("a", now, (0,))
    assert timeline.earliest_start(job, cap, [], now) == ("a", now, (0,))


def test_timeline_gives_the_plain_sweep_as_jobs_turn_over_and_the_clock_moves() -> None:
    """Cycle after cycle one job ends and another starts on its GPU, the snapshot saying
    so, and the search is asked at times before, among and after the ends (also earlier
    than the last): the overdue GPUs kept between searches give the plain sweep's answer."""
    rng = random.Random(7)
    nodes = [builders.node(f"n{k:02d}", 4) for k in range(30)]
    ids = iter(range(1, 100_000))

    def started(name: str, index: int) -> RunningJob:
        return builders.running(
            next(ids), name, (index,), started=rng.uniform(0, 5_000), limit=rng.uniform(60, 9_000)
        )

    jobs = [started(n.name, i) for n in nodes for i in range(4) if (n.name, i) != ("n07", 2)]
    snapshot = builders.snap(nodes, running_jobs=jobs)
    timeline = ReleaseTimeline(False)
    before = tuple(jobs)
    assert not timeline.sync(before)
    assert timeline.sync(before)
    asks = [builders.job(1, 1), builders.job(2, 2), builders.job(3, 4)]
    for _cycle in range(60):
        k = rng.randrange(len(jobs))
        gone = jobs.pop(k)
        new = started(gone.node, gone.gpu_indices[0])
        jobs.append(new)
        after = tuple(jobs)
        assert timeline.sync(after, RunningChanges(before, (new,), (gone,)))
        before = after
        now = rng.choice([0.0, 1_000.0, 4_000.0, 7_000.0, 10_000.0, 20_000.0])
        current = replace(snapshot, running=after, now=now)
        cap = FreeCapacity.from_snapshot(current)
        occupants = running_occupants(after, use_predictions=False)
        held = occupant_of(builders.job(9, 1), "n03", (1,), now + rng.uniform(-100, 3_000))
        for placed in ([], [held]):
            for ask in asks:
                expected = earliest_start(ask, cap, occupants + placed, now)
                assert timeline.earliest_start(ask, cap, placed, now) == expected
        due = sorted((n, i) for end, n, i in timeline._sorted if end < timeline._due_now)
        assert timeline._due == due
    assert timeline.changes_used == 60
