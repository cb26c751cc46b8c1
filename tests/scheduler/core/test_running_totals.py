"""The quota ledger from totals kept across cycles equals a ledger summed afresh.

`QuotaLedger.from_snapshot(snapshot, carried=True)` starts from per-team and per-user
totals updated by job object since the last call; whatever it saw before, the ledger must
hold the same numbers (and the same entries) as one built from the snapshot's running jobs.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import quota
from scheduler.core.model import RunningJob, Snapshot
from scheduler.core.quota import QuotaLedger
from tests.scheduler.policies.strategies import snapshots

CHECKS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same(snapshot: Snapshot) -> None:
    carried = QuotaLedger.from_snapshot(snapshot, carried=True)
    fresh = QuotaLedger.from_snapshot(snapshot)
    assert carried.team_usage == fresh.team_usage
    assert carried.user_usage == fresh.user_usage
    assert carried.cpu_usage == fresh.cpu_usage
    assert carried.memory_usage == fresh.memory_usage


@CHECKS
@given(
    first=snapshots(max_nodes=4, max_pending=2),
    keep=st.lists(st.booleans(), min_size=16, max_size=16),
    whole_only=st.booleans(),
)
def test_carried_totals_equal_fresh_ones_across_cycles(
    first: Snapshot, keep: list[bool], whole_only: bool
) -> None:
    if whole_only:
        first = replace(first, running=tuple(r for r in first.running if r.gpus))
    _same(first)
    running = [r for i, r in enumerate(first.running) if keep[i % len(keep)]]
    if running:
        running[0] = replace(running[0], user="zed", cpus=running[0].cpus + 4)
    second = replace(first, running=tuple(running))
    _same(second)
    _same(first)
    _same(replace(first, running=()))


def test_whole_gpu_jobs_are_carried_and_a_fraction_sums_afresh() -> None:
    jobs = tuple(
        RunningJob(i, "t", f"u{i % 2}", "n0", (i,), started_at=0.0, time_limit=60.0, gpus=1)
        for i in range(4)
    )
    totals = quota.RunningTotals()
    assert totals.sync(jobs) is None  # nothing carried over yet: summed afresh
    assert totals.sync(jobs) is not None
    assert totals.sync(jobs[1:]) == ({"t": 3.0}, {("t", "u0"): 1.0, ("t", "u1"): 2.0}, {}, {})
    assert totals.rebuilds == 0
    share = replace(jobs[0], id=9, gpus=0, gpu_memory_mb=1000, gpu_compute_percent=30)
    assert totals.sync((*jobs[1:], share)) is None
    assert totals.sync(jobs[1:]) is not None
