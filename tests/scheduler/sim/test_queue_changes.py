"""The queue changes the simulator tells its policy (Snapshot.pending_changes) are the
real ones, and a run that uses them decides what a run without them decides."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core import quota
from scheduler.core.reservation import ReleaseTimeline, timeline
from scheduler.policies import get_policy, priority
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.engine import PolicyDriver, simulate
from scheduler.sim.sources import synthetic
from scheduler.sim.state import SimConfig
from scheduler.sim.transform import equal_guarantees, prepare

CLUSTER = parse_cluster("2x4xV100+1x8xV100")


@pytest.fixture(scope="module")
def jobs():
    raw = synthetic(220, total_gpus=CLUSTER.total_gpus, load=0.95, n_teams=3, seed=5, max_gpus=8)
    prepared, _ = prepare(raw, total_gpus=CLUSTER.total_gpus, max_node_gpus=8, seed=5)
    return prepared


class _Recorder:
    """The policy's driver, keeping every snapshot (or dropping the queue changes)."""

    def __init__(self, name: str, *, drop_changes: bool = False) -> None:
        self.policy = get_policy(name)
        self.name = name
        self.time_dependent = True
        self.drop_changes = drop_changes
        self.snapshots: list = []

    def schedule(self, snapshot):
        if self.drop_changes:
            snapshot = replace(snapshot, pending_changes=None)
        self.snapshots.append(snapshot)
        return self.policy.schedule(snapshot)

    def may_preempt(self, settings, guarantees):
        return self.policy.may_preempt(settings, guarantees)


def _outcome(result):
    runs = result.state.jobs
    return {i: (r.state, r.first_start, r.finish, r.preemptions) for i, r in runs.items()}


def test_changes_are_the_difference_between_queues(jobs):
    recorder = _Recorder("las")  # preempts: jobs leave the queue and come back
    simulate(jobs, CLUSTER, PolicyDriver(recorder), SimConfig())
    snapshots = recorder.snapshots
    assert len(snapshots) > 50
    assert snapshots[0].pending_changes is None
    for before, after in zip(snapshots, snapshots[1:], strict=False):
        changes = after.pending_changes
        assert changes is not None and changes.before is before.pending
        gone = {id(j) for j in changes.removed}
        assert len(gone) == len(changes.removed)
        assert gone <= {id(j) for j in before.pending}
        expected = [j for j in before.pending if id(j) not in gone] + list(changes.added)
        assert sorted(map(id, expected)) == sorted(map(id, after.pending))
    assert any(s.pending_changes.removed for s in snapshots[1:])


@pytest.mark.parametrize("name", ["priority", "backfill"])
@pytest.mark.parametrize("guarantees", [False, True])
def test_a_run_with_the_changes_equals_one_without(jobs, name, guarantees):
    team_guaranteed = equal_guarantees(jobs, CLUSTER.total_gpus) if guarantees else {}
    config = SimConfig(team_guaranteed=team_guaranteed)
    used = priority._ROWS.changes_used
    told = simulate(jobs, CLUSTER, PolicyDriver(_Recorder(name)), config)
    assert priority._ROWS.changes_used > used + 50
    plain = simulate(jobs, CLUSTER, PolicyDriver(_Recorder(name, drop_changes=True)), config)
    assert _outcome(told) == _outcome(plain)
    assert told.cycles == plain.cycles


def test_running_changes_are_the_difference_between_running_lists(jobs):
    recorder = _Recorder("las")  # preempts: jobs stop before their end
    simulate(jobs, CLUSTER, PolicyDriver(recorder), SimConfig())
    snapshots = recorder.snapshots
    assert snapshots[0].running_changes is None
    for before, after in zip(snapshots, snapshots[1:], strict=False):
        changes = after.running_changes
        assert changes is not None and changes.before is before.running
        gone = {id(j) for j in changes.removed}
        assert len(gone) == len(changes.removed)
        assert gone <= {id(j) for j in before.running}
        expected = [j for j in before.running if id(j) not in gone] + list(changes.added)
        assert sorted(map(id, expected)) == sorted(map(id, after.running))
    assert any(s.running_changes.removed for s in snapshots[1:])
    assert any(s.running_changes.added for s in snapshots[1:])


@pytest.mark.parametrize("name", ["priority", "las"])
def test_a_run_with_the_running_changes_equals_one_without(jobs, name):
    class _NoRunningChanges(_Recorder):
        def schedule(self, snapshot):
            return super().schedule(replace(snapshot, running_changes=None))

    config = SimConfig(team_guaranteed=equal_guarantees(jobs, CLUSTER.total_gpus))
    used = quota._RUNNING.changes_used
    timelines = timeline._TIMELINES.values()
    swept = sum(t.changes_used for t in timelines)
    told = simulate(jobs, CLUSTER, PolicyDriver(_Recorder(name)), config)
    assert quota._RUNNING.changes_used > used + 50
    if name == "priority":  # reserves for the first job that does not fit
        assert sum(t.changes_used for t in timelines) > swept + 20
    plain = simulate(jobs, CLUSTER, PolicyDriver(_NoRunningChanges(name)), config)
    assert _outcome(told) == _outcome(plain)
    assert told.cycles == plain.cycles


@pytest.mark.parametrize("predictions", [False, True])
def test_release_timeline_from_running_changes_equals_one_compared(jobs, predictions):
    recorder = _Recorder("las")  # preempts: jobs stop before their end
    simulate(jobs, CLUSTER, PolicyDriver(recorder), SimConfig())
    told, compared = ReleaseTimeline(predictions), ReleaseTimeline(predictions)
    for snapshot in recorder.snapshots:
        assert told.sync(snapshot.running, snapshot.running_changes) == compared.sync(
            snapshot.running
        )
        assert told._sorted == compared._sorted
        assert told._gpus == compared._gpus
    assert told.changes_used > 50 and not compared.changes_used
