"""The priority order kept across cycles is the order sorted from scratch.

`priority_order` keeps the score inputs of the pending jobs it saw last and updates them by
job object; whatever it saw before, its order must be the plain sort of the same queue
(settings "fast_paths" false).
"""

from __future__ import annotations

import random
from dataclasses import replace
from types import MappingProxyType

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scheduler.core.model import PendingChanges, PendingJob, Snapshot, TeamState
from scheduler.policies import priority
from scheduler.policies.cycle_parts import GuaranteeTest, QueueRest
from scheduler.policies.priority import _Weights, priority_order
from scheduler.policies.priority_rows import _rank
from tests.scheduler.core.builders import node
from tests.scheduler.policies.strategies import snapshots

CHECKS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _plain(snapshot: Snapshot) -> list[PendingJob]:
    plain = replace(snapshot, settings=MappingProxyType({**snapshot.settings, "fast_paths": False}))
    return priority_order(plain)


def _check(snapshot: Snapshot) -> None:
    assert priority_order(snapshot) == _plain(snapshot)


@CHECKS
@given(
    first=snapshots(max_nodes=3, max_pending=20),
    keep=st.lists(st.booleans(), min_size=20, max_size=20),
    later=st.sampled_from([0.0, 60.0, 86_400.0, 10 * 86_400.0]),
    usage=st.floats(0, 1e7),
)
def test_order_across_cycles_is_the_plain_order(
    first: Snapshot, keep: list[bool], later: float, usage: float
) -> None:
    _check(first)
    # Next cycle: some jobs started (gone), one came back as a new object with the same id
    # and another priority, a new team queued, the clock and a team's usage moved.
    pending = [j for i, j in enumerate(first.pending) if keep[i]]
    if pending:
        pending[0] = replace(pending[0], priority=pending[0].priority + 3)
    pending.append(PendingJob(99_999, "newteam", "ada", first.now - 5.0, 600.0, qos="high"))
    teams = dict(first.teams)
    slug = next(iter(teams))
    teams[slug] = replace(teams[slug], decayed_usage=usage)
    second = replace(
        first,
        pending=tuple(pending),
        now=first.now + later,
        teams=MappingProxyType(teams),
    )
    _check(second)
    _check(first)


@CHECKS
@given(snapshot=snapshots(max_nodes=2, max_pending=10))
def test_a_queue_with_a_job_twice(snapshot: Snapshot) -> None:
    _check(snapshot)
    if not snapshot.pending:
        return
    _check(replace(snapshot, pending=(*snapshot.pending, snapshot.pending[0])))
    _check(snapshot)


def test_an_id_twice_is_left_to_the_plain_path() -> None:
    jobs = tuple(PendingJob(i, "t", "u", float(i), 60.0) for i in range(1, 4))
    snapshot = Snapshot(now=100.0, nodes=(), pending=jobs)
    priority._ROWS.sync(jobs)
    assert priority._ROWS.sync(jobs)
    twin = replace(jobs[0], priority=5)
    assert not priority._ROWS.sync((*jobs, twin))
    assert priority_order(snapshot) == _plain(snapshot)


def test_rows_are_built_once_objects_carry_over() -> None:
    jobs = tuple(PendingJob(i, "t", "u", float(i), 60.0) for i in range(1, 6))
    snapshot = Snapshot(now=100.0, nodes=(), pending=jobs)
    priority_order(snapshot)
    priority_order(snapshot)
    builds = priority._ROWS.builds
    assert priority._ROWS.sync(jobs[1:])
    assert priority._ROWS.builds == builds
    # New objects every cycle (as production builds them): sorted the plain way, no rows.
    fresh = tuple(replace(j) for j in jobs)
    assert not priority._ROWS.sync(fresh)
    assert not priority._ROWS.sync(tuple(replace(j) for j in jobs))
    assert priority._ROWS.builds == builds
    # The same objects again: the rows are built.
    again = tuple(replace(j) for j in jobs)
    priority._ROWS.sync(again)
    assert priority._ROWS.sync(again)
    assert priority._ROWS.builds == builds + 1


def _changed(before: Snapshot, after: Snapshot, added: list, removed: list) -> Snapshot:
    changes = PendingChanges(before.pending, tuple(added), tuple(removed))
    return replace(after, pending_changes=changes)


@CHECKS
@given(
    first=snapshots(max_nodes=3, max_pending=20),
    keep=st.lists(st.booleans(), min_size=20, max_size=20),
    later=st.sampled_from([0.0, 60.0, 86_400.0]),
)
def test_order_from_the_queue_changes_is_the_plain_order(
    first: Snapshot, keep: list[bool], later: float
) -> None:
    _check(first)
    _check(first)  # the rows are built
    used = priority._ROWS.changes_used
    kept = [j for i, j in enumerate(first.pending) if keep[i]]
    gone = [j for i, j in enumerate(first.pending) if not keep[i]]
    new = [
        PendingJob(99_998, "newteam", "ada", first.now - 5.0, 600.0, qos="high"),
        PendingJob(99_999, "vision", "bob", first.now, 60.0, gpus=2),
    ]
    second = replace(first, pending=(*kept, *new), now=first.now + later)
    told = _changed(first, second, new, gone)
    _check(told)
    assert priority._ROWS.changes_used == used + 1
    # Two cycles on: the changes since the second queue.
    third = replace(second, pending=tuple(new), now=second.now + 60.0)
    _check(_changed(second, third, [], kept))
    assert priority._ROWS.changes_used == used + 2


@CHECKS
@given(first=snapshots(max_nodes=3, max_pending=12))
def test_changes_that_do_not_match_the_rows_are_not_used(first: Snapshot) -> None:
    assume(first.pending)
    _check(first)
    _check(first)
    used = priority._ROWS.changes_used
    new = PendingJob(99_999, "vision", "bob", first.now, 60.0, gpus=2)
    second = replace(first, pending=(*first.pending, new))
    # Said to leave, yet still queued; a copy said to leave that was never queued; the
    # changes from a queue the rows were not brought up to.
    wrong = [
        _changed(first, second, [new], list(first.pending[:1])),
        _changed(first, second, [new], [replace(j) for j in first.pending[:1]]),
        replace(second, pending_changes=PendingChanges((), (new,), ())),
    ]
    for told in wrong:
        _check(told)
        _check(first)
    told_right = _changed(first, second, [new], [])
    _check(told_right)
    assert priority._ROWS.changes_used == used + 1


@CHECKS
@given(
    scores=st.lists(st.sampled_from([0.0, -0.0, 1.5, 2.0, 1e3, 1e3 + 1e-9]), max_size=40),
    data=st.data(),
)
def test_rank_from_any_start_is_the_lexsort(scores: list[float], data: st.DataObject) -> None:
    n = len(scores)
    submitted = data.draw(st.lists(st.sampled_from([0.0, 5.0, 7.0]), min_size=n, max_size=n))
    ids = data.draw(st.permutations(range(n)))
    start = data.draw(st.permutations(range(n)))  # the rows' order before the sort
    rows = np.array(start, np.int64)
    s, sub, i = np.array(scores)[rows], np.array(submitted)[rows], np.array(ids, float)[rows]
    want = np.lexsort((i, sub, -s))
    assert _rank(-s, sub, i).tolist() == want.tolist()


def test_rank_with_ties_out_of_submit_order_falls_back_to_the_lexsort() -> None:
    # Equal scores, rows in the wrong (submit time, id) order: the stable sort alone would
    # keep them as they are.
    scores = np.array([3.0, 3.0, 3.0, 9.0])
    submitted = np.array([5.0, 5.0, 1.0, 0.0])
    ids = np.array([2.0, 1.0, 3.0, 4.0])
    assert _rank(-scores, submitted, ids).tolist() == [3, 2, 1, 0]
    nan = np.array([np.nan, 1.0, np.nan])
    assert _rank(nan, np.zeros(3), np.array([2.0, 1.0, 0.0])).tolist() == [1, 2, 0]


def test_order_carried_over_cycles_is_the_plain_order() -> None:
    # Many cycles over one queue of carried objects: jobs start, new ones of every team
    # arrive (some submitted before jobs already queued), usage and the clock move, so
    # the last order is a stale start for the next; each order must be the plain sort.
    rng = random.Random(7)
    teams = ("a", "b", "c")
    queue: list[PendingJob] = []
    next_id = 1
    now = 1000.0
    for _cycle in range(60):
        for _ in range(rng.randint(0, 6)):
            queue.append(
                PendingJob(
                    next_id,
                    rng.choice(teams),
                    "u",
                    now - rng.choice([0.0, 0.0, 30.0, 500.0]),
                    600.0,
                    gpus=rng.choice([1, 2, 8]),
                    priority=rng.choice([0, 0, 5]),
                )
            )
            next_id += 1
        rng.shuffle(queue)
        for _ in range(rng.randint(0, 3)):
            if queue:
                queue.pop(rng.randrange(len(queue)))
        usage = {t: TeamState(t, decayed_usage=rng.uniform(0, 1e4)) for t in teams}
        # The size term's weight and the largest node move now and then too.
        weights = {"priority_weight_size": rng.choice([100.0, 100.0, 100.0, 7.5])}
        nodes = rng.choice([(), (), (), (node("n", 4),)])
        snapshot = Snapshot(
            now=now,
            nodes=nodes,
            pending=tuple(queue),
            teams=MappingProxyType(usage),
            settings=MappingProxyType(weights),
        )
        _check(snapshot)
        now += rng.choice([0.0, 60.0, 3600.0])
    assert priority._ROWS._ranked is not None


@CHECKS
@given(
    columns=st.lists(
        st.tuples(
            st.floats(-1e6, 1e6),
            st.floats(-1e3, 1e3),
            st.floats(-1e3, 1e3),
            st.floats(-1e3, 1e3),
            st.floats(-1e3, 1e3),
        ),
        min_size=1,
        max_size=30,
    ),
    now=st.floats(0, 2e6),
)
def test_negated_scores_are_the_scores_negated(columns: list, now: float) -> None:
    submitted, teams, qos, size, nice = (np.array(c) for c in zip(*columns, strict=True))
    w = _Weights(Snapshot(now=now, nodes=()))
    size_terms, nice_terms = w.w_size * size, w.w_job * nice
    got = w.negated_scores(now, submitted, teams, qos, size_terms, nice_terms)
    age = np.minimum(np.maximum(now - submitted, 0.0), w.max_age) / w.max_age
    want = -(w.w_age * age + teams + qos + size_terms + nice_terms)
    assert (got == want).all()


def _fraction_view(rest: QueueRest) -> list[tuple[int, int, str | None]]:
    pos, comp, model = rest._fractions_from(0)
    names = [*rest._models, None]  # code -1: any model
    return list(zip(pos.tolist(), comp.tolist(), [names[m] for m in model.tolist()], strict=True))


@CHECKS
@given(
    first=snapshots(max_nodes=3, max_pending=20),
    keep=st.lists(st.booleans(), min_size=20, max_size=20),
    usage=st.lists(st.floats(0, 8), min_size=3, max_size=3),
)
def test_the_walks_columns_from_the_rows_are_those_read_from_the_jobs(
    first: Snapshot, keep: list[bool], usage: list[float]
) -> None:
    """What the walk reads of the queue (fractions' compute and model, the guarantee
    test's teams and amounts) comes from the rows as it would from the jobs."""
    priority_order(first)
    priority_order(first)  # the rows are built
    kept = [j for i, j in enumerate(first.pending) if keep[i]]
    gone = [j for i, j in enumerate(first.pending) if not keep[i]]
    new = [
        PendingJob(
            99_997,
            "newteam",
            "ada",
            first.now,
            60.0,
            gpu_memory_mb=1024,
            gpu_compute_percent=30,
            gpu_model="B200",
        ),
        PendingJob(99_998, "newteam", "ada", first.now, 60.0, gpu_memory_mb=1024),
        PendingJob(99_999, "vision", "bob", first.now, 60.0, gpus=2, gpu_model="A100"),
    ]
    second = _changed(first, replace(first, pending=(*kept, *new)), new, gone)
    teams = {**second.teams, "newteam": TeamState("newteam", guaranteed_gpus=1)}
    second = replace(second, teams=MappingProxyType(teams))
    jobs, rest = priority.priority_ranked(second)
    assert rest is not None
    plain = QueueRest.of(jobs)
    assert _fraction_view(rest) == _fraction_view(plain)
    names = sorted({j.team for j in jobs})
    used = {t: usage[k % 3] for k, t in enumerate(names)}
    for i in range(len(jobs)):
        assert (
            rest.guarantee_test(teams).within(i, len(jobs), used)
            == GuaranteeTest(jobs, teams).within(i, len(jobs), used)
        ).all()
