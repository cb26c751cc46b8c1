"""The quota ledger from totals kept across cycles equals a ledger summed afresh.

`QuotaLedger.from_snapshot(snapshot, carried=True)` starts from per-team and per-user
totals updated by job object since the last call; whatever it saw before, the ledger must
hold the same numbers (and the same entries) as one built from the snapshot's running jobs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import quota
from scheduler.core.model import RunningChanges, RunningJob, Snapshot
from scheduler.core.quota import QuotaLedger
from tests.scheduler.policies.strategies import snapshots

CHECKS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same(snapshot: Snapshot) -> None:
    carried = QuotaLedger.from_snapshot(snapshot, carried=True)
    fresh = QuotaLedger.from_snapshot(snapshot)
    # The same entries in the same order, the same floats to the last bit.
    assert list(carried.team_usage.items()) == list(fresh.team_usage.items())
    assert list(carried.user_usage.items()) == list(fresh.user_usage.items())
    assert list(carried.cpu_usage.items()) == list(fresh.cpu_usage.items())
    assert list(carried.memory_usage.items()) == list(fresh.memory_usage.items())


def _totals(running: tuple[RunningJob, ...]) -> quota.Totals:
    fresh = QuotaLedger({}, running)
    return fresh.team_usage, fresh.user_usage, fresh.cpu_usage, fresh.memory_usage


def _job(i: int, team: str, user: str, *, compute: int = 0, gpus: int = 0, **kw: int) -> RunningJob:
    return RunningJob(
        i,
        team,
        user,
        "n0",
        (0,),
        started_at=0.0,
        time_limit=60.0,
        gpus=gpus,
        gpu_memory_mb=None if gpus else 1000,
        gpu_compute_percent=None if gpus else compute,
        **kw,
    )


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


def test_fractions_are_summed_in_the_order_of_the_running_jobs() -> None:
    # 0.1 + 0.2 + 0.3 and 0.3 + 0.2 + 0.1 are different floats: each order gives the sum a
    # fresh ledger makes over it.
    jobs = tuple(_job(i, "t", "u", compute=c) for i, c in enumerate((10, 20, 30)))
    flipped = jobs[::-1]
    assert _totals(jobs)[0] != _totals(flipped)[0]
    totals = quota.RunningTotals()
    assert totals.sync(jobs) is None  # nothing carried over yet: summed afresh
    for running in (jobs, flipped, jobs, tuple(jobs), flipped[1:], jobs):
        assert totals.sync(running) == _totals(running)
    assert totals.rebuilds == 0


def test_whole_gpu_jobs_and_fractions_are_carried() -> None:
    jobs = tuple(_job(i, "t", f"u{i % 2}", gpus=1) for i in range(4))
    totals = quota.RunningTotals()
    assert totals.sync(jobs) is None
    assert totals.sync(jobs) == ({"t": 4.0}, {("t", "u0"): 2.0, ("t", "u1"): 2.0}, {}, {})
    assert totals.sync(jobs[1:]) == ({"t": 3.0}, {("t", "u1"): 2.0, ("t", "u0"): 1.0}, {}, {})
    share = _job(9, "s", "u0", compute=30, cpus=4, memory_mb=512)
    assert totals.sync((*jobs[1:], share)) == (
        {"t": 3.0, "s": 0.3},
        {("t", "u1"): 2.0, ("t", "u0"): 1.0, ("s", "u0"): 0.3},
        {"s": 4},
        {"s": 512},
    )
    assert totals.rebuilds == 0


def test_new_objects_every_cycle_are_summed_afresh() -> None:
    jobs = tuple(_job(i, "t", "u", gpus=1) for i in range(3))
    totals = quota.RunningTotals()
    assert totals.sync(jobs) is None
    assert totals.sync(jobs) is not None
    fresh = tuple(replace(j) for j in jobs)  # equal copies, as production may build
    assert totals.sync(fresh) is None
    assert totals.rebuilds == 1
    assert totals.sync(fresh) == _totals(fresh)


def test_a_job_too_big_for_float_sums_makes_the_ledger_sum_afresh() -> None:
    jobs = (_job(1, "t", "u", gpus=1), _job(2, "t", "u", gpus=1, memory_mb=1 << 40))
    totals = quota.RunningTotals()
    totals.sync(jobs)
    assert totals.sync(jobs) is None
    assert totals.sync(jobs[:1]) == _totals(jobs[:1])


@CHECKS
@given(
    first=snapshots(max_nodes=4, max_pending=2),
    steps=st.lists(
        st.tuples(
            st.lists(st.booleans(), min_size=8, max_size=8),  # which jobs keep running
            st.integers(0, 3),  # how many start
            st.sampled_from(["told", "none", "wrong before", "wrong jobs", "shuffled"]),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_carried_totals_equal_fresh_ones_whatever_the_changes_say(
    first: Snapshot, steps: list[tuple[list[bool], int, str]]
) -> None:
    """Cycles as a simulator runs them (jobs stop, new ones start after the others), told
    the changes, told none, or told wrong ones: always a fresh ledger's totals."""
    totals = quota.RunningTotals()
    running = first.running
    assert totals.sync(running) in (None, _totals(running))
    assert totals.sync(running) == _totals(running)
    fresh_ids = iter(range(100_000, 200_000))
    for keep, starts, told in steps:
        stay = tuple(r for i, r in enumerate(running) if keep[i % len(keep)])
        gone = tuple(r for i, r in enumerate(running) if not keep[i % len(keep)])
        new = tuple(
            replace(first.running[k % len(first.running)], id=next(fresh_ids), user=f"u{k}")
            for k in range(starts if first.running else 0)
        )
        after = stay + new
        changes: RunningChanges | None = RunningChanges(running, new, gone)
        if told == "none":
            changes = None
        elif told == "wrong before":
            changes = RunningChanges(after, new, gone)
        elif told == "wrong jobs":
            changes = RunningChanges(running, gone, new)
        elif told == "shuffled":
            after = after[::-1]
        got = totals.sync(after, changes)
        if got is None:
            # Summed afresh: only where none of the jobs was in the last call.
            assert not stay
        else:
            assert got == _totals(after)
        running = after


def test_rows_of_jobs_long_gone_are_dropped() -> None:
    totals = quota.RunningTotals()
    running = tuple(_job(i, f"t{i % 3}", f"u{i % 5}", compute=7 + i % 50) for i in range(10))
    totals.sync(running)
    totals.sync(running)
    for cycle in range(600):
        new = tuple(_job(1000 + 10 * cycle + k, "t0", "u9", compute=13) for k in range(5))
        after = running[5:] + new
        assert totals.sync(after, RunningChanges(running, new, running[:5])) == _totals(after)
        running = after
    assert len(totals._rows) <= 2 * len(running) + 1024
    assert totals.changes_used == 600


@CHECKS
@given(
    snapshots(), st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=12), st.booleans()
)
def test_moves_before_the_first_read_give_what_an_eager_ledger_gives(
    snapshot: Snapshot, moves: list[tuple[bool, int]], carried: bool
) -> None:
    # A ledger from a snapshot counts its running jobs when first read; the places and ends
    # booked before then are applied after the count, in order (a release clamps at zero,
    # so the order matters).
    jobs = [*snapshot.running, *snapshot.pending]
    lazy = QuotaLedger.from_snapshot(snapshot, carried=carried)
    eager = QuotaLedger(snapshot.teams, snapshot.running)
    for taken, k in moves:
        if jobs:
            for ledger in (lazy, eager):
                (ledger.take if taken else ledger.release)(jobs[k % len(jobs)])
    assert list(lazy.team_usage.items()) == list(eager.team_usage.items())
    assert list(lazy.user_usage.items()) == list(eager.user_usage.items())
    assert list(lazy.cpu_usage.items()) == list(eager.cpu_usage.items())
    assert list(lazy.memory_usage.items()) == list(eager.memory_usage.items())


class _Uncountable:
    """A running job whose size may not be read: any count of the running jobs fails."""

    team, user, cpus, memory_mb = "vision", "ada", 0, 0

    @property
    def gpu_equivalent(self) -> float:
        raise AssertionError("the running jobs were counted")


def test_a_job_larger_than_its_teams_guarantee_needs_no_count() -> None:
    from tests.scheduler.core.builders import job, team

    teams = {"vision": team("vision", guaranteed_gpus=2)}
    snapshot = Snapshot(now=0.0, nodes=(), running=(_Uncountable(),), pending=(), teams=teams)  # type: ignore[arg-type]
    ledger = QuotaLedger.from_snapshot(snapshot)
    ledger.take(job(1, 4, team="vision"))  # booked, not counted yet
    assert not ledger.within_guarantee(job(2, 3, team="vision"))
    assert not ledger.within_guarantee(job(3, 3, team="other"))  # no guarantee at all
    # One that fits the guarantee needs the team's usage: the count happens then.
    with pytest.raises(AssertionError, match="counted"):
        ledger.within_guarantee(job(4, 1, team="vision"))
