from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleet.models import GpuRelease, Job, JobEvent, JobMember, JobState, Node
from fleet.selectors.jobs import job_state_reason
from fleet.services import messaging
from fleet.services.job_states import Actor, job_transition
from scheduler.cycle.apply import apply_plan, waiting_order
from scheduler.cycle.config import settings_get
from scheduler.cycle.forecast import estimates_for
from scheduler.cycle.queue_order import queue_waits, store_waits
from scheduler.cycle.runner import plan_for, run_cycle
from scheduler.cycle.snapshot import build_snapshot
from scheduler.models import CycleRecord
from tests.scheduler.cycle.conftest import make_job, make_node, make_running

pytestmark = pytest.mark.django_db


def _starts(sent: list[Any]) -> list[dict[str, Any]]:
    return [kwargs for task, _, kwargs in sent if task == messaging.START_JOB_TASK]


def _use_priority() -> None:
    """The priority policy, which reserves GPUs for the first in line (the default policy,
    gittins-tiers, does not reserve)."""
    row = settings_get()
    row.policy = "priority"
    row.save()


def test_places_on_free_gpus_of_up_nodes_only_with_events(
    owner: Any, team: Any, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    _use_priority()
    make_node("sim-a", 4)
    make_node("sim-b", 4, state="draining")
    make_node("sim-c", 4, state="down")
    jobs = [make_job(owner, team) for _ in range(6)]
    with django_capture_on_commit_callbacks(execute=True):
        record = run_cycle()
    assert record is not None and record.placed == 4 and record.pending == 6

    placed = Job.objects.filter(state=JobState.ASSIGNED).select_related("node")
    assert {j.node.name for j in placed} == {"sim-a"}
    assert sorted(i for j in placed for i in j.gpu_indices) == [0, 1, 2, 3]
    assert all(j.attempt == 1 and j.queue_position is None for j in placed)
    for job in placed:
        event = JobEvent.objects.get(job=job, to_state="assigned")
        assert event.actor_kind == "scheduler" and event.attempt == 1
        assert event.reason.startswith("placed by policy priority on sim-a GPU")
    starts = _starts(sent)
    assert sorted(s["job_id"] for s in starts) == sorted(j.pk for j in placed)
    assert all(s["attempt"] == 1 and len(s["spec"]["gpu_indices"]) == 1 for s in starts)
    assert {q for t, q, _ in sent if t == messaging.START_JOB_TASK} == {"node.sim-a"}

    waits = queue_waits()
    waiting = sorted(
        Job.objects.filter(state=JobState.PENDING), key=lambda j: waits.positions[j.pk]
    )
    assert [waits.position(j.pk) for j in waiting] == [1, 2] and len(waits.ids) == 2
    assert {j.pk for j in waiting} <= {j.pk for j in jobs}
    # The priority policy reserves GPUs for the first in line; the second waits behind it.
    reasons = [job_state_reason(job=j, fetched_by=owner) for j in waiting]
    assert reasons[0].startswith("first in line: GPUs ")
    assert waiting[0].eta is not None
    assert reasons[1].startswith("needs 1 GPU on one node; no suitable GPU is free")
    assert f"reserved for job {waiting[0].pk}" in reasons[1]


def test_a_gang_of_four_goes_to_one_node(owner: Any, team: Any, sent: list[Any]) -> None:
    a = make_node("sim-a", 4)
    make_node("sim-b", 4)
    make_running(owner, team, a, [2])
    gang = make_job(owner, team, gpus=4)
    run_cycle()
    gang.refresh_from_db()
    assert gang.state == JobState.ASSIGNED
    assert gang.node is not None and gang.node.name == "sim-b"
    assert sorted(gang.gpu_indices) == [0, 1, 2, 3]


def test_fractional_jobs_share_a_gpu(owner: Any, team: Any, sent: list[Any]) -> None:
    _use_priority()
    make_node("sim-a", 1)
    fractions = [
        make_job(owner, team, gpus=0, gpu_memory_mb=30000, gpu_compute_percent=40) for _ in range(3)
    ]
    record = run_cycle()
    assert record is not None and record.placed == 2
    states = {j.pk: j for j in Job.objects.filter(id__in=[f.pk for f in fractions])}
    placed = [j for j in states.values() if j.state == JobState.ASSIGNED]
    assert [j.gpu_indices for j in placed] == [[0], [0]]
    assert placed[0].node_id == placed[1].node_id
    third = next(j for j in states.values() if j.state == JobState.PENDING)
    # 2 x 30000 MB of 81920 MB leaves 21920 MB: the third waits for one to end.
    reason = job_state_reason(job=third, fetched_by=owner)
    assert reason.startswith("first in line: GPUs 0 on sim-a are reserved")


def test_a_decision_whose_job_changed_since_the_snapshot_is_skipped(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    make_node("sim-a", 2)
    held, cancelled = make_job(owner, team), make_job(owner, team)
    snap = build_snapshot()
    _, plan, _ = plan_for(snap)
    assert {p.job_id for p in plan.places} == {held.pk, cancelled.pk}
    job_transition(job_id=held.pk, action="hold", actor=Actor.user(owner), reason="wait")
    job_transition(job_id=cancelled.pk, action="cancel", actor=Actor.user(owner))
    outcome = apply_plan(snap, plan)
    assert outcome.placed == [] and set(outcome.skipped) == {held.pk, cancelled.pk}
    assert "changed since the snapshot" in outcome.skipped[held.pk]
    assert Job.objects.get(pk=held.pk).state == JobState.HELD
    assert Job.objects.get(pk=cancelled.pk).state == JobState.CANCELLED
    assert not JobEvent.objects.filter(to_state="assigned").exists()


def test_a_placement_on_a_gpu_taken_or_a_node_drained_meanwhile_is_skipped(
    owner: Any, team: Any, teammate: Any, sent: list[Any]
) -> None:
    a = make_node("sim-a", 1)
    make_node("sim-b", 1)
    first, second = make_job(owner, team), make_job(owner, team)
    snap = build_snapshot()
    _, plan, _ = plan_for(snap)
    where = {p.job_id: p.node for p in plan.places}
    assert set(where) == {first.pk, second.pk}
    # Meanwhile a job shows up on sim-a's GPU and sim-b starts draining.
    make_running(teammate, team, a, [0])
    Node.objects.filter(name="sim-b").update(state="draining")
    outcome = apply_plan(snap, plan)
    assert outcome.placed == []
    reasons = " | ".join(outcome.skipped.values())
    assert "GPU 0 is now taken on sim-a" in reasons and "node sim-b is no longer up" in reasons
    assert Job.objects.filter(pk__in=[first.pk, second.pk], state=JobState.PENDING).count() == 2


def test_the_check_reads_what_holds_the_placement_nodes_gang_members_and_holds_included(
    owner: Any, team: Any, teammate: Any, sent: list[Any]
) -> None:
    """The check before applying reads the rows on the nodes the plan places on: a later
    member of a multi-node job and a stopping attempt's hold there count; a member of an
    attempt that is over does not."""
    a, b, c = make_node("sim-a", 1), make_node("sim-b", 1), make_node("sim-c", 1)
    jobs = [make_job(owner, team) for _ in range(3)]
    snap = build_snapshot()
    _, plan, _ = plan_for(snap)
    where = {p.node: p.job_id for p in plan.places}
    assert set(where) == {"sim-a", "sim-b", "sim-c"} and set(where.values()) == {j.pk for j in jobs}
    # Meanwhile: a two-node job starts with its second member on sim-a (its first on a node
    # the plan does not use), a job stopping on sim-b still holds its GPU, and a member of
    # an earlier attempt of that two-node job is left on sim-c.
    gang = make_running(teammate, team, make_node("sim-x", 1), [0], gpus=2, gpus_per_node=1)
    Job.objects.filter(pk=gang.pk).update(attempt=2)
    JobMember.objects.create(job=gang, attempt=2, rank=0, node=gang.node, gpu_indices=[0])
    JobMember.objects.create(job=gang, attempt=2, rank=1, node=a, gpu_indices=[0])
    JobMember.objects.create(job=gang, attempt=1, rank=1, node=c, gpu_indices=[0])
    stopping = make_job(teammate, team)  # requeued: pending again, its GPU not yet free
    GpuRelease.objects.create(
        node=b, job=stopping, attempt=1, gpu_indices=[0], gpus=1,
        expires_at=timezone.now() + timedelta(minutes=5),
    )  # fmt: skip
    outcome = apply_plan(snap, plan)
    assert outcome.placed == [where["sim-c"]]
    assert "GPU 0 is now taken on sim-a" in outcome.skipped[where["sim-a"]]
    assert "GPU 0 is now taken on sim-b" in outcome.skipped[where["sim-b"]]


def test_waits_are_written_only_for_jobs_still_pending(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    _use_priority()
    make_running(owner, team, make_node("sim-a", 1), [0])
    waiting, held = make_job(owner, team), make_job(owner, team)
    snap = build_snapshot()
    policy, plan, _ = plan_for(snap)
    assert plan.places == ()
    job_transition(job_id=held.pk, action="hold", actor=Actor.user(owner), reason="my hold")
    assert store_waits(waiting_order(estimates_for(snap, policy, plan), apply_plan(snap, plan)))
    waiting.refresh_from_db()
    held.refresh_from_db()
    # The stored order (scheduler.cycle.queue_order) still lists the held job; only what
    # is pending now shows its wait.
    assert waiting.state == JobState.PENDING and waiting.queue_position is None
    reason = job_state_reason(job=waiting, fetched_by=owner)
    assert reason.endswith("reserved for it")  # when: the ETA, not the reason
    assert (held.state, held.state_reason) == ("held", "my hold")
    assert job_state_reason(job=held, fetched_by=owner) == "my hold"
    # The next cycle stores the order without the held job; one more, with nothing
    # changed, stores nothing.
    for wrote in (True, False):
        snap = build_snapshot()
        policy, plan, _ = plan_for(snap)
        estimates = estimates_for(snap, policy, plan)
        assert store_waits(waiting_order(estimates, apply_plan(snap, plan))) is wrote
    assert queue_waits().ids == (waiting.pk,)


def test_preemption_requeues_a_borrowers_job_for_a_team_under_its_guarantee(
    owner: Any,
    team: Any,
    outsider: Any,
    other_team: Any,
    sent: list[Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    team.guaranteed_gpus = 4
    team.save()
    a = make_node("sim-a", 4)
    borrowed = [make_running(outsider, other_team, a, [i], preemptible=True) for i in range(4)]
    last_chance = borrowed[0]
    Job.objects.filter(pk=last_chance.pk).update(max_requeues=0)
    claimant = make_job(owner, team, gpus=4)
    with django_capture_on_commit_callbacks(execute=True):
        record = run_cycle()
    assert record is not None and record.preempted == 4 and record.placed == 0
    states = dict(Job.objects.filter(team=other_team).values_list("id", "state"))
    assert states.pop(last_chance.pk) == JobState.FAILED
    assert set(states.values()) == {JobState.PENDING}
    for job in Job.objects.filter(pk__in=states):
        assert job.requeues == 1 and job.node is None
        event = job.events.get(to_state="pending")
        assert event.actor_kind == "scheduler"
        assert event.reason == (
            f"preempted for job {claimant.pk}: team vision reclaims its guaranteed GPUs "
            "from borrowing team speech"
        )
    failed_reason = Job.objects.get(pk=last_chance.pk).state_reason
    assert failed_reason.endswith("not requeued: it was requeued 0 times (max_requeues 0)")
    stops = [(q, k) for t, q, k in sent if t == messaging.STOP_JOB_TASK]
    assert sorted(k["job_id"] for _, k in stops) == sorted(b.pk for b in borrowed)
    assert all(q == "node.sim-a" and k["attempt"] == 1 for q, k in stops)
    assert any(t == messaging.SCHEDULE_TASK for t, _, _ in sent)

    # The victims are in their grace period: their GPUs stay busy until the agent reports
    # each attempt's end, and only then does a cycle place the claimant.
    run_cycle()
    claimant.refresh_from_db()
    assert claimant.state == JobState.PENDING
    from fleet.services.job_reports import job_report_apply

    for victim in borrowed:
        job_report_apply(node=a, job_id=victim.pk, attempt=1, state="preempted", exit_code=-15)
    run_cycle()
    claimant.refresh_from_db()
    assert claimant.state == JobState.ASSIGNED and sorted(claimant.gpu_indices) == [0, 1, 2, 3]


def test_team_usage_decays_with_the_half_life(
    owner: Any, team: Any, other_team: Any, sent: list[Any]
) -> None:
    from scheduler.cycle.config import settings_update
    from scheduler.models import TeamUsage

    settings_update(user=None, params={"fairshare_half_life": 3600})
    a = make_node("sim-a", 2)
    now = timezone.now()
    job = make_running(owner, team, a, [0, 1])
    Job.objects.filter(pk=job.pk).update(started_at=now - timedelta(hours=1))
    run_cycle(now=now)
    first = TeamUsage.objects.get(team=team).decayed_gpu_seconds
    # 2 GPUs for an hour, decayed from its middle (half an hour ago): 7200 * 0.5 ** 0.5.
    assert first == pytest.approx(7200 * 0.5**0.5, rel=1e-6)
    assert TeamUsage.objects.get(team=other_team).decayed_gpu_seconds == 0
    job_transition(job_id=job.pk, action="succeed", actor=Actor.node("sim-a"))
    Job.objects.filter(pk=job.pk).update(finished_at=now)
    run_cycle(now=now + timedelta(hours=1))
    assert TeamUsage.objects.get(team=team).decayed_gpu_seconds == pytest.approx(first / 2)


def test_team_usage_adds_what_running_jobs_ran_since_the_stored_figure(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    from scheduler.core.usage import decay_usage
    from scheduler.cycle.config import settings_update
    from scheduler.models import TeamUsage

    settings_update(user=None, params={"fairshare_half_life": 3600})
    a = make_node("sim-a", 4)
    now = timezone.now()
    whole = make_running(owner, team, a, [0, 1])
    Job.objects.filter(pk=whole.pk).update(started_at=now - timedelta(hours=1))
    run_cycle(now=now)
    first = TeamUsage.objects.get(team=team)
    # A job that started after the stored figure counts from its start, one before it from
    # the figure's time.
    late = make_running(owner, team, a, [2])
    Job.objects.filter(pk=late.pk).update(started_at=now + timedelta(minutes=30))
    run_cycle(now=now + timedelta(hours=1))
    second = TeamUsage.objects.get(team=team)
    used = 2 * 3600.0 + 1 * 1800.0
    expected = decay_usage(first.decayed_gpu_seconds, used, 3600.0, 3600.0)
    assert second.decayed_gpu_seconds == pytest.approx(expected, rel=1e-9)
    assert second.as_of == now + timedelta(hours=1)


def test_only_the_latest_cycle_records_are_kept(
    owner: Any, team: Any, sent: list[Any], monkeypatch: Any
) -> None:
    from scheduler.cycle import runner

    monkeypatch.setattr(runner, "KEEP_CYCLES", 2)
    records = [run_cycle() for _ in range(3)]
    assert list(CycleRecord.objects.values_list("id", flat=True)) == [
        r.pk for r in reversed(records[1:]) if r is not None
    ]


def test_the_celery_task_runs_a_cycle_on_the_control_queue(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    from scheduler.tasks import schedule_cycle

    make_node("sim-a", 1)
    job = make_job(owner, team)
    assert schedule_cycle.name == messaging.SCHEDULE_TASK and schedule_cycle.queue == "control"
    summary = schedule_cycle.apply().get()
    assert summary["placed"] == 1 and CycleRecord.objects.filter(pk=summary["cycle"]).exists()
    assert Job.objects.get(pk=job.pk).state == JobState.ASSIGNED
