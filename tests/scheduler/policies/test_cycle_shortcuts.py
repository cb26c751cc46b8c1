"""The cycle's shortcuts decide exactly what the plain walk decides.

Shortcuts (settings "fast_paths", on by default): the vectorised priority order, the
reservation's per-shape memory of failed backfills, and recording the rest of the queue at
once when nothing more can start. Settings "explain" false drops the wait sentences and
nothing else.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from unittest.mock import patch

import pytest
from hypothesis import given

from scheduler.core.model import (
    GpuState,
    NodeState,
    PendingJob,
    Plan,
    RunningJob,
    Snapshot,
    TeamState,
    Wait,
)
from scheduler.core.placement import FreeCapacity
from scheduler.policies import get_policy, walk
from scheduler.policies.base import Cycle
from scheduler.policies.priority import priority_order, priority_scores
from tests.scheduler.invariants import assert_plan_valid
from tests.scheduler.policies.strategies import (
    CYCLE_CHECKS,
    WALKING_POLICIES,
    busy_snapshots,
    snapshots,
    with_settings,
)


def _quiet(plan: Plan) -> Plan:
    return replace(plan, waits=tuple(Wait(w.job_id, "", w.eta) for w in plan.waits))


@pytest.mark.parametrize("name", WALKING_POLICIES)
@CYCLE_CHECKS
@given(snapshot=busy_snapshots())
def test_shortcuts_give_the_plain_plan(name: str, snapshot: Snapshot) -> None:
    reference = get_policy(name).schedule(with_settings(snapshot, fast_paths=False))
    fast = get_policy(name).schedule(snapshot)
    assert fast == reference
    assert_plan_valid(snapshot, fast)
    # The walk looks ahead in windows that double; with the first one a single position
    # wide, these queues take several windows, as long queues do.
    with patch.object(walk, "_WINDOW", 1):
        assert get_policy(name).schedule(snapshot) == reference


@pytest.mark.parametrize("name", WALKING_POLICIES)
@CYCLE_CHECKS
@given(snapshot=busy_snapshots())
def test_explain_off_only_drops_the_sentences(name: str, snapshot: Snapshot) -> None:
    reference = get_policy(name).schedule(with_settings(snapshot, fast_paths=False))
    quiet = get_policy(name).schedule(with_settings(snapshot, explain=False))
    assert quiet == _quiet(reference)


@pytest.mark.parametrize("name", WALKING_POLICIES)
@CYCLE_CHECKS
@given(snapshot=busy_snapshots())
def test_plan_waits_off_keeps_the_decisions(name: str, snapshot: Snapshot) -> None:
    reference = get_policy(name).schedule(with_settings(snapshot, fast_paths=False))
    light = get_policy(name).schedule(with_settings(snapshot, explain=False, plan_waits=False))
    assert light.waits == ()
    assert (light.places, light.preempts, light.reserves, light.notes) == (
        reference.places,
        reference.preempts,
        reference.reserves,
        reference.notes,
    )
    assert light.order == reference.order[: len(light.order)]


def _capacity_view(cap: FreeCapacity, snapshot: Snapshot) -> tuple:
    gpus = {(n.name, g.index): cap.free_on(n.name, g.index) for n in snapshot.nodes for g in n.gpus}
    fits = [cap.best_fit_members(j) for j in snapshot.pending]
    wholes = {n.name: (cap.whole_free(n.name), cap.host_free(n.name)) for n in snapshot.nodes}
    return (
        gpus,
        fits,
        wholes,
        cap.largest_free_block(),
        cap.free_gpus_total(),
        cap.partial_compute(),
    )


@CYCLE_CHECKS
@given(snapshot=snapshots(max_nodes=4, max_pending=20))
def test_capacity_rebuilt_from_reused_nodes_is_fresh(snapshot: Snapshot) -> None:
    first = FreeCapacity.from_snapshot(snapshot)
    for job in snapshot.pending:  # a cycle's bookings must not leak into the next one
        choice = first.best_fit_members(job)
        if choice is not None:
            first.take_members(job, choice)
    again = FreeCapacity.from_snapshot(snapshot)  # same NodeState objects: cached parts
    copies = tuple(replace(n, gpus=tuple(replace(g) for g in n.gpus)) for n in snapshot.nodes)
    fresh = FreeCapacity.from_snapshot(replace(snapshot, nodes=copies))
    assert _capacity_view(again, snapshot) == _capacity_view(fresh, snapshot)


@CYCLE_CHECKS
@given(snapshot=snapshots(max_pending=40))
def test_vectorised_priority_order_matches_the_scores(snapshot: Snapshot) -> None:
    scores = priority_scores(snapshot)
    expected = sorted(snapshot.pending, key=lambda j: (-scores[j.id], j.submitted_at, j.id))
    assert priority_order(snapshot) == expected


def _full_fleet(pending: int = 30) -> Snapshot:
    """Two 8-GPU nodes, one full and one with 3 GPUs free; two short single-GPU jobs first
    in line, then a queue of gangs too big for what they leave."""
    full = tuple(GpuState(i, "A100", 81920, 0, 0) for i in range(8))
    some = tuple(GpuState(i, "A100", 81920, *((81920, 100) if i < 3 else (0, 0))) for i in range(8))
    running = (
        RunningJob(1, "vision", "ada", "a", tuple(range(8)), 0.0, 50_000.0, gpus=8),
        RunningJob(2, "nlp", "bob", "b", tuple(range(3, 8)), 0.0, 60_000.0, gpus=5),
    )
    jobs = [
        PendingJob(900 + k, "vision", "ada", 0.0, 600.0, gpus=1, priority=500) for k in range(2)
    ]
    jobs += [
        PendingJob(100 + k, "nlp", "cy", float(k), 90_000.0, gpus=4 + k % 5) for k in range(pending)
    ]
    return Snapshot(
        now=40_000.0,
        nodes=(NodeState("a", full), NodeState("b", some)),
        running=running,
        pending=tuple(jobs),
        teams=MappingProxyType({"vision": TeamState("vision"), "nlp": TeamState("nlp")}),
    )


@pytest.mark.parametrize("name", ["priority", "backfill", "sjf"])
def test_settled_queue_is_recorded_at_once_with_the_same_plan(name, monkeypatch) -> None:
    snapshot = _full_fleet()
    reference = get_policy(name).schedule(with_settings(snapshot, fast_paths=False))
    calls = []
    original = Cycle._wait_rest

    def spy(self, jobs):
        calls.append(len(jobs))
        return original(self, jobs)

    monkeypatch.setattr(Cycle, "_wait_rest", spy)
    assert get_policy(name).schedule(snapshot) == reference
    assert get_policy(name).schedule(with_settings(snapshot, explain=False)) == _quiet(reference)
    assert calls and calls[0] >= 20
    assert {p.job_id for p in reference.places} == {900, 901}


def _reserved_node_too_small(pending: int = 30) -> Snapshot:
    """Node a busy until 70,000; node b with GPUs 0-2 free and the rest busy until 50,000.
    An 8-GPU job first in line reserves node b (its free GPUs held); behind it short
    4-GPU jobs end before the reservation starts but find no 4 GPUs there or anywhere."""
    full = tuple(GpuState(i, "A100", 81920, 0, 0) for i in range(8))
    some = tuple(GpuState(i, "A100", 81920, *((81920, 100) if i < 3 else (0, 0))) for i in range(8))
    running = (
        RunningJob(1, "vision", "ada", "a", tuple(range(8)), 0.0, 70_000.0, gpus=8),
        RunningJob(2, "nlp", "bob", "b", tuple(range(3, 8)), 0.0, 50_000.0, gpus=5),
    )
    jobs = [PendingJob(800, "vision", "ada", 0.0, 90_000.0, gpus=8, priority=900)]
    jobs += [PendingJob(100 + k, "nlp", "cy", float(k), 600.0, gpus=4) for k in range(pending)]
    return Snapshot(
        now=40_000.0,
        nodes=(NodeState("a", full), NodeState("b", some)),
        running=running,
        pending=tuple(jobs),
        teams=MappingProxyType({"vision": TeamState("vision"), "nlp": TeamState("nlp")}),
    )


@pytest.mark.parametrize("name", ["priority", "backfill"])
def test_walk_settles_when_no_later_job_fits_the_reserved_node(name, monkeypatch) -> None:
    snapshot = _reserved_node_too_small()
    reference = get_policy(name).schedule(with_settings(snapshot, fast_paths=False))
    calls = []
    original = Cycle._wait_rest

    def spy(self, jobs):
        calls.append(len(jobs))
        return original(self, jobs)

    monkeypatch.setattr(Cycle, "_wait_rest", spy)
    assert get_policy(name).schedule(snapshot) == reference
    assert calls and calls[0] >= 20
    assert [r.job_id for r in reference.reserves] == [800]
    assert reference.reserves[0].node == "b" and not reference.places


def _few_fit_far_apart(pending: int = 60) -> Snapshot:
    """An 8-GPU job first in line reserves node b (GPUs 0-2 free, the rest free at 50,000);
    behind it long 4-GPU jobs that fit nowhere, with single-GPU jobs at positions 20 and
    45 that fit on node c's two free GPUs."""
    full = tuple(GpuState(i, "A100", 81920, 0, 0) for i in range(8))
    some = tuple(GpuState(i, "A100", 81920, *((81920, 100) if i < 3 else (0, 0))) for i in range(8))
    two = tuple(GpuState(i, "A100", 81920, *((81920, 100) if i < 2 else (0, 0))) for i in range(8))
    running = (
        RunningJob(1, "vision", "ada", "a", tuple(range(8)), 0.0, 70_000.0, gpus=8),
        RunningJob(2, "nlp", "bob", "b", tuple(range(3, 8)), 0.0, 50_000.0, gpus=5),
        RunningJob(3, "nlp", "bob", "c", tuple(range(2, 8)), 0.0, 90_000.0, gpus=6),
    )
    jobs = [PendingJob(800, "vision", "ada", 0.0, 90_000.0, gpus=8, priority=900)]
    for k in range(pending):
        gpus = 1 if k in (20, 45) else 4
        jobs.append(PendingJob(100 + k, "nlp", "cy", float(k), 90_000.0, gpus=gpus))
    return Snapshot(
        now=40_000.0,
        nodes=(NodeState("a", full), NodeState("b", some), NodeState("c", two)),
        running=running,
        pending=tuple(jobs),
        teams=MappingProxyType({"vision": TeamState("vision"), "nlp": TeamState("nlp")}),
    )


@pytest.mark.parametrize("name", ["priority", "backfill", "fcfs"])
@pytest.mark.parametrize("extra", [{}, {"explain": False}, {"explain": False, "plan_waits": False}])
@pytest.mark.parametrize("window", [512, 2])
def test_walk_goes_from_one_job_that_may_start_to_the_next(
    name, extra, window, monkeypatch
) -> None:
    monkeypatch.setattr(walk, "_WINDOW", window)
    snapshot = with_settings(_few_fit_far_apart(), **extra)
    reference = get_policy(name).schedule(with_settings(snapshot, fast_paths=False))
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
        assert fast.order == reference.order[: len(fast.order)]
    if name == "fcfs":  # blocked behind the first job: nothing else is looked at
        assert len(considered) == 1 and not reference.places
    else:
        assert considered == [800, 120, 145]
        assert [p.job_id for p in reference.places] == [120, 145]
        assert [r.job_id for r in reference.reserves] == [800]


def _hold_hosts(cap: FreeCapacity, snapshot: Snapshot) -> None:
    for node in snapshot.nodes:
        cap.unhold_host(node.name, cap.hold_host(node.name, 2, 4096))
        cap.hold_host(node.name, 2, 4096)


def _hold_gpus(cap: FreeCapacity, snapshot: Snapshot) -> None:
    for node in snapshot.nodes:
        for gpu in node.gpus[:2]:
            cap.unhold(node.name, gpu.index, cap.hold(node.name, gpu.index))
            cap.hold(node.name, gpu.index)


def _give_back(cap: FreeCapacity, snapshot: Snapshot) -> None:
    for node in snapshot.nodes:
        for gpu in node.gpus[:2]:
            cap.unhold(node.name, gpu.index, (1024, 10))


def _release(cap: FreeCapacity, snapshot: Snapshot) -> None:
    for running in snapshot.running:
        for member in running.allocations:
            cap.release(running, member.node, member.gpu_indices)


def _take(cap: FreeCapacity, snapshot: Snapshot) -> None:
    for job in snapshot.pending:
        choice = cap.best_fit_members(job)
        if choice is not None:
            cap.take_members(job, choice)


@pytest.mark.parametrize("booking", [_hold_hosts, _hold_gpus, _give_back, _release, _take])
@CYCLE_CHECKS
@given(snapshot=snapshots(max_nodes=4, max_pending=20))
def test_bookings_do_not_reach_the_shared_nodes(booking, snapshot: Snapshot) -> None:
    """A FreeCapacity shares each node with the next one built from the same NodeState
    until it books there; every kind of booking must copy the node first."""
    booking(FreeCapacity.from_snapshot(snapshot), snapshot)
    again = FreeCapacity.from_snapshot(snapshot)
    copies = tuple(replace(n, gpus=tuple(replace(g) for g in n.gpus)) for n in snapshot.nodes)
    fresh = FreeCapacity.from_snapshot(replace(snapshot, nodes=copies))
    assert _capacity_view(again, snapshot) == _capacity_view(fresh, snapshot)


def _guarantees_with_one_reclaimer() -> Snapshot:
    """`_few_fit_far_apart` with team guarantees: vision and nlp use more than theirs, so
    their jobs cannot reclaim; a speech job at position 30 keeps its team within its
    guarantee, so it may reclaim GPUs from the borrowers."""
    snapshot = _few_fit_far_apart()
    jobs = list(snapshot.pending)
    jobs[31] = PendingJob(700, "speech", "di", 30.0, 90_000.0, gpus=4)
    teams = {
        "vision": TeamState("vision", guaranteed_gpus=4),
        "nlp": TeamState("nlp", guaranteed_gpus=4),
        "speech": TeamState("speech", guaranteed_gpus=8),
    }
    return replace(snapshot, pending=tuple(jobs), teams=MappingProxyType(teams))


@pytest.mark.parametrize("name", ["priority", "backfill"])
@pytest.mark.parametrize("extra", [{}, {"explain": False}, {"preemption": False}])
def test_walk_with_guarantees_considers_only_jobs_that_may_start_or_reclaim(
    name, extra, monkeypatch
) -> None:
    snapshot = with_settings(_guarantees_with_one_reclaimer(), **extra)
    reference = get_policy(name).schedule(with_settings(snapshot, fast_paths=False))
    considered = []
    original = Cycle.consider

    def spy(self, job):
        considered.append(job.id)
        return original(self, job)

    monkeypatch.setattr(Cycle, "consider", spy)
    assert get_policy(name).schedule(snapshot) == reference
    assert [p.job_id for p in reference.places] == [120, 145]
    if extra.get("preemption", True):
        assert sorted(considered) == [120, 145, 700, 800]
        assert [p.job_id for p in reference.preempts] == [2]
    else:
        assert considered == [800, 120, 145] and not reference.preempts
