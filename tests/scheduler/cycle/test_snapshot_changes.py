"""A process reads the job rows in full once, then only those whose version changed: every
kind of write after the first snapshot must show in the next one, whoever made it.

These tests commit (transaction=True): inside one open transaction every row carries that
transaction's version, and the snapshot reads everything in full there."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from fleet.models import Gpu, Job, JobState, Node
from fleet.services.job_states import SCHEDULER, job_transition
from fleet.services.jobs import job_cancel
from fleet.services.nodes import node_drain
from scheduler.cycle import snapshot_nodes, snapshot_rows
from scheduler.cycle.apply import apply_plan, clear_stale
from scheduler.cycle.history import learn_history
from scheduler.cycle.queue_order import queue_waits
from scheduler.cycle.runner import plan_for, run_cycle
from scheduler.cycle.snapshot import build_snapshot
from scheduler.cycle.snapshot_jobs import CARRIED
from scheduler.cycle.snapshot_rows import KEPT
from tests.factories import GpuFactory
from tests.scheduler.cycle.conftest import make_job, make_node, make_running

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row versions are PostgreSQL's"),
]


@pytest.fixture(autouse=True)
def fresh_process(sent: Any, monkeypatch: Any) -> Iterator[None]:
    KEPT.clear()  # as a process that starts: nothing kept from another test's database
    snapshot_nodes.CARRIED_NODES.__init__()  # type: ignore[misc]
    # A few jobs here, so most of them change: read them by ids all the same.
    monkeypatch.setattr(snapshot_rows, "FULL_READ_SHARE", 1.0)
    yield
    KEPT.clear()


def _snapshot() -> Any:
    return build_snapshot(save_usage=False).core


def _pending(core: Any) -> dict[int, Any]:
    return {j.id: j for j in core.pending}


def test_the_second_snapshot_reads_only_the_rows_that_changed(owner: Any, team: Any) -> None:
    make_node("sim-a", 4)
    jobs = [make_job(owner, team) for _ in range(5)]
    _snapshot()
    assert KEPT.last == "full"
    Job.objects.filter(pk=jobs[2].pk).update(priority=7)
    core = _snapshot()
    assert (KEPT.last, KEPT.fetched) == ("changes", 1)
    assert _pending(core)[jobs[2].pk].priority == 7
    assert [j.id for j in core.pending] == [j.pk for j in jobs]  # in id order, as read in full


def test_a_priority_edit_a_new_job_and_a_wait_written_by_hand_are_seen(
    owner: Any, team: Any
) -> None:
    make_node("sim-a", 4)
    edited, waiting = make_job(owner, team), make_job(owner, team)
    first = _snapshot()
    Job.objects.filter(pk=edited.pk).update(priority=-5)
    with connection.cursor() as cursor:  # as psql or another program would
        cursor.execute(
            f"UPDATE {Job._meta.db_table} SET state_reason = 'by hand', queue_position = 9 "
            "WHERE id = %s",
            [waiting.pk],
        )
    new = make_job(owner, team)
    snap = build_snapshot(save_usage=False)
    assert KEPT.last == "changes"
    pending = _pending(snap.core)
    assert pending[edited.pk].priority == -5
    assert new.pk in pending
    assert snap.waits[waiting.pk][:2] == ("by hand", 9)
    # The wait is not something the policy reads: the object stays the same one.
    assert pending[waiting.pk] is _pending(first)[waiting.pk]


def test_a_cancelled_a_deleted_and_a_dispatched_job_leave_the_queue(owner: Any, team: Any) -> None:
    node = make_node("sim-a", 4)
    cancelled, deleted, dispatched, kept = (make_job(owner, team) for _ in range(4))
    _snapshot()
    job_cancel(user=owner, job=cancelled)
    Job.objects.filter(pk=deleted.pk).delete()
    Job.objects.filter(pk=dispatched.pk).update(
        state=JobState.ASSIGNED, node=node, gpu_indices=[0, 1], gpus=2, attempt=1
    )
    core = _snapshot()
    assert KEPT.last == "changes"
    assert set(_pending(core)) == {kept.pk}
    assert [(j.id, j.node, j.gpu_indices) for j in core.running] == [
        (dispatched.pk, "sim-a", (0, 1))
    ]
    assert [g.is_whole_free for g in core.nodes[0].gpus] == [False, False, True, True]


def test_a_requeued_job_moves_from_running_to_pending_and_its_gpus_free_up(
    owner: Any, team: Any
) -> None:
    node = make_node("sim-a", 2)
    job = make_running(owner, team, node, [0, 1], preemptible=True)
    first = _snapshot()
    assert [j.id for j in first.running] == [job.pk] and not first.pending
    job_transition(job_id=job.pk, action="preempt", actor=SCHEDULER, reason="x", attempt=1)
    core = _snapshot()
    assert KEPT.last == "changes"
    assert not core.running and list(_pending(core)) == [job.pk]


def test_a_drained_node_is_not_schedulable_in_the_next_snapshot(
    owner: Any, team: Any, staff: Any
) -> None:
    node = make_node("sim-a", 4)
    make_job(owner, team)
    assert _snapshot().nodes[0].schedulable
    node_drain(node=node, user=staff)
    assert not _snapshot().nodes[0].schedulable


def test_a_snapshot_inside_a_transaction_that_wrote_reads_all_and_keeps_nothing(
    owner: Any, team: Any
) -> None:
    make_node("sim-a", 4)
    job = make_job(owner, team)
    _snapshot()
    with transaction.atomic():
        Job.objects.filter(pk=job.pk).update(priority=3)
        assert _pending(_snapshot())[job.pk].priority == 3
        assert KEPT.last == "full" and not KEPT.versions
        # Its later writes carry the same version as the earlier ones.
        Job.objects.filter(pk=job.pk).update(priority=4)
        assert _pending(_snapshot())[job.pk].priority == 4
    assert _pending(_snapshot())[job.pk].priority == 4


def test_kept_rows_are_read_again_in_full_after_a_while(
    owner: Any, team: Any, monkeypatch: Any
) -> None:
    make_node("sim-a", 4)
    make_job(owner, team)
    _snapshot()
    _snapshot()
    assert KEPT.last == "changes"
    monkeypatch.setattr(snapshot_rows, "FULL_READ_EVERY_S", 0.0)
    _snapshot()
    assert KEPT.last == "full"


def test_the_waits_a_cycle_writes_are_kept_and_the_next_snapshot_reads_no_row_again(
    owner: Any, team: Any
) -> None:
    make_node("sim-a", 1)
    make_running(owner, team, Node.objects.get(name="sim-a"), [0])
    waiting = [make_job(owner, team, gpus=1) for _ in range(3)]
    record = run_cycle()
    # The forecast after the first cycle wrote every ETA, fenced on the rows' versions.
    assert record is not None and record.timings["etas_written"] == 3
    snap = build_snapshot(save_usage=False)
    assert (KEPT.last, KEPT.fetched) == ("changes", 0)
    stored = {
        j.pk: (j.state_reason, j.queue_position, None if j.eta is None else int(j.eta.timestamp()))
        for j in Job.objects.filter(pk__in=[w.pk for w in waiting])
    }
    assert snap.waits == stored
    assert all(p is None for _, p, _ in stored.values())  # read from the stored order
    assert sorted(queue_waits().positions.values()) == [1, 2, 3]


def test_a_wait_is_not_written_over_a_row_changed_since_the_snapshot(owner: Any, team: Any) -> None:
    make_node("sim-a", 1)
    make_running(owner, team, Node.objects.get(name="sim-a"), [0])
    # Positions an older version left on the rows, which a cycle clears.
    edited = make_job(owner, team, gpus=1, queue_position=1)
    other = make_job(owner, team, gpus=1, queue_position=2)
    snap = build_snapshot(save_usage=False)
    Job.objects.filter(pk=edited.pk).update(priority=9, state_reason="edited meanwhile")
    assert clear_stale(snap) == 1
    assert Job.objects.get(pk=edited.pk).queue_position == 1
    assert Job.objects.get(pk=other.pk).queue_position is None
    snap = build_snapshot(save_usage=False)
    assert (KEPT.last, KEPT.fetched) == ("changes", 1)
    assert _pending(snap.core)[edited.pk].priority == 9
    assert snap.waits[other.pk][1] is None and snap.waits[edited.pk][1] == 1


def test_a_gpu_added_or_changed_and_a_job_ending_show_on_the_node(owner: Any, team: Any) -> None:
    node = make_node("sim-a", 2)
    running = make_running(owner, team, node, [0])
    first = _snapshot().nodes[0]
    assert [g.is_whole_free for g in first.gpus] == [False, True]
    assert _snapshot().nodes[0] is first  # nothing changed: the same object
    GpuFactory(node=node, index=2, model="A100-80GB", memory_mb=81920)
    Gpu.objects.filter(node=node, index=1).update(memory_mb=40960)
    second = _snapshot().nodes[0]
    assert [(g.index, g.memory_mb) for g in second.gpus] == [(0, 81920), (1, 40960), (2, 81920)]
    job_transition(job_id=running.pk, action="succeed", actor=SCHEDULER, reason="x", attempt=1)
    assert all(g.is_whole_free for g in _snapshot().nodes[0].gpus)


def test_the_gpu_inventory_is_read_again_only_when_its_generation_moves(
    owner: Any, team: Any
) -> None:
    node = make_node("sim-a", 2)
    first = _snapshot().nodes[0]
    kept = snapshot_nodes.CARRIED_NODES.gpus
    assert _snapshot().nodes[0] is first and snapshot_nodes.CARRIED_NODES.gpus is kept
    # A write by hand, outside every service: the trigger still moves the generation.
    before = snapshot_nodes.gpu_generation()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE fleet_gpu SET model = 'H100-80GB' WHERE node_id = %s", [node.pk])
    assert snapshot_nodes.gpu_generation() not in (None, before)
    assert {g.model for g in _snapshot().nodes[0].gpus} == {"H100-80GB"}
    # A write rolled back leaves a generation never given before: read again, same rows.
    generation = snapshot_nodes.gpu_generation()
    with pytest.raises(RuntimeError), transaction.atomic():
        Gpu.objects.filter(node=node).update(memory_mb=1024)
        assert snapshot_nodes.gpu_generation() != generation
        _snapshot()  # read inside the transaction: the process keeps what it saw there
        raise RuntimeError
    assert snapshot_nodes.gpu_generation() == generation
    assert {g.memory_mb for g in _snapshot().nodes[0].gpus} == {81920}


def test_the_gpu_inventory_is_read_again_after_a_while_whatever_its_generation(
    owner: Any, team: Any, monkeypatch: Any
) -> None:
    make_node("sim-a", 2)
    _snapshot()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE fleet_gpu DISABLE TRIGGER USER")
        try:
            cursor.execute("UPDATE fleet_gpu SET memory_mb = 40960")
        finally:
            cursor.execute("ALTER TABLE fleet_gpu ENABLE TRIGGER USER")
    # No trigger fired: within the bound the kept rows stand, after it they are read again.
    assert {g.memory_mb for g in _snapshot().nodes[0].gpus} == {81920}
    later = snapshot_nodes.monotonic() + snapshot_nodes.GPU_READ_EVERY_S + 1
    monkeypatch.setattr(snapshot_nodes, "monotonic", lambda: later)
    assert {g.memory_mb for g in _snapshot().nodes[0].gpus} == {40960}


def test_with_nothing_changed_the_job_lists_are_kept_whole_until_an_owner_is_renamed(
    owner: Any, team: Any
) -> None:
    node = make_node("sim-a", 4)
    running = make_running(owner, team, node, [0])
    waiting = [make_job(owner, team) for _ in range(3)]
    first = build_snapshot(save_usage=False)
    second = build_snapshot(save_usage=False)
    assert CARRIED.whole and KEPT.last == "changes" and KEPT.fetched == 0
    assert [id(j) for j in second.core.pending] == [id(j) for j in first.core.pending]
    assert second.core.running[0] is first.core.running[0]
    assert second.core.nodes is first.core.nodes  # every node the same: the same tuple
    assert second.waits == first.waits and second.waits is not first.waits
    assert second.attempts == {running.pk: 1, **{j.pk: 0 for j in waiting}}
    # The rows read the same, but the name the jobs carry does not.
    type(owner).objects.filter(pk=owner.pk).update(username="renamed")
    third = build_snapshot(save_usage=False)
    assert not CARRIED.whole
    assert {j.user for j in third.core.pending} == {"renamed"}
    assert third.core.running[0].user == "renamed"
    assert build_snapshot(save_usage=False).core.pending[0] is third.core.pending[0]


def test_outside_a_transaction_the_history_is_kept_while_its_rows_versions_are(
    owner: Any, team: Any
) -> None:
    now = timezone.now()
    done = [
        make_job(
            owner, team, name="train", state="succeeded", time_limit=3600,
            started_at=now - timedelta(seconds=600), finished_at=now,
        )
        for _ in range(3)
    ]  # fmt: skip
    first = learn_history(100)
    assert learn_history(100) is first
    with connection.cursor() as cursor:  # by hand: no service, no timestamp bumped
        cursor.execute(
            "UPDATE fleet_job SET started_at = %s WHERE id = %s",
            [now - timedelta(seconds=3000), done[0].pk],
        )
    second = learn_history(100)
    assert second is not first and learn_history(100) is second
    before, after = first.predict(owner.pk, "train", 3600), second.predict(owner.pk, "train", 3600)
    assert before is not None and after is not None and after > before


def test_the_check_before_applying_sees_a_gpu_taken_by_a_row_changed_meanwhile(
    owner: Any, team: Any, teammate: Any
) -> None:
    a = make_node("sim-a", 2)
    other = make_running(teammate, team, a, [0])
    waiting = make_job(owner, team)
    snap = build_snapshot()
    _, plan, _ = plan_for(snap)
    assert [(p.job_id, p.gpu_indices) for p in plan.places] == [(waiting.pk, (1,))]
    # Meanwhile the running job's row says it holds GPU 1 as well (a write by hand).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE fleet_job SET gpu_indices = '[0, 1]', gpus = 2 WHERE id = %s", [other.pk]
        )
    outcome = apply_plan(snap, plan)
    assert outcome.placed == [] and "GPU 1 is now taken on sim-a" in outcome.skipped[waiting.pk]
