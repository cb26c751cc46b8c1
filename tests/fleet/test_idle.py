"""Idle GPUs: telemetry rows written at chosen times decide whether a running job is idle;
an idle attempt is marked once, its owner notified, and with idle_action="stop" the job is
cancelled through the state machine and its node told to stop it."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleet.models import (
    Job,
    JobEvent,
    JobIdle,
    JobMember,
    Notification,
    NotificationSettings,
    TelemetryRollup,
    TelemetrySample,
)
from fleet.services.idle import idle_check
from tests.factories import GpuFactory, JobFactory, NodeFactory, TeamFactory

pytestmark = pytest.mark.django_db

NOW = timezone.now().replace(microsecond=0)


def _job(
    *,
    minutes: int = 60,
    util: float = 5.0,
    action: str = "warn",
    started_ago: timedelta = timedelta(hours=3),
    gpus: int = 2,
) -> tuple[Any, list[Any]]:
    team = TeamFactory(idle_minutes=minutes, idle_util_percent=util, idle_action=action)
    node = NodeFactory()
    held = [GpuFactory(node=node, index=i) for i in range(gpus)]
    GpuFactory(node=node, index=gpus)  # a GPU the job does not hold
    job: Any = JobFactory(team=team, gpus=gpus)
    Job.objects.filter(id=job.pk).update(
        state="running",
        attempt=1,
        node=node,
        attempt_node=node,
        gpu_indices=list(range(gpus)),
        started_at=NOW - started_ago,
    )
    job.refresh_from_db()
    return job, held


def _samples(gpu: Any, util: float, *, since: datetime, until: datetime, every_s: int = 30) -> None:
    t = since
    rows = []
    while t <= until:
        rows.append(
            TelemetrySample(gpu=gpu, sampled_at=t, util_percent=util, memory_total_mb=81920)
        )
        t += timedelta(seconds=every_s)
    TelemetrySample.objects.bulk_create(rows)


def _rollups(gpu: Any, util_max: float, *, since: datetime, until: datetime) -> None:
    t = since.replace(second=0)
    rows = []
    while t <= until:
        rows.append(
            TelemetryRollup(
                gpu=gpu,
                minute=t,
                samples=6,
                util_percent=util_max / 2,
                util_percent_max=util_max,
                memory_total_mb=81920,
            )
        )
        t += timedelta(minutes=1)
    TelemetryRollup.objects.bulk_create(rows)


def test_idle_job_flagged_once_and_notified(
    django_capture_on_commit_callbacks: Any, monkeypatch: Any
) -> None:
    from fleet.services import notifications

    job, gpus = _job()
    NotificationSettings.objects.create(user=job.owner, webhook_url="https://example.org/h")
    monkeypatch.setattr(notifications, "_enqueue", lambda pk: None)
    # The older part of the window only as rollups, the recent part raw.
    _rollups(gpus[0], 2.0, since=NOW - timedelta(minutes=70), until=NOW - timedelta(minutes=20))
    _rollups(gpus[1], 3.0, since=NOW - timedelta(minutes=70), until=NOW - timedelta(minutes=20))
    for gpu in gpus:
        _samples(gpu, 1.0, since=NOW - timedelta(minutes=20), until=NOW)

    with django_capture_on_commit_callbacks(execute=True):
        assert idle_check(now=NOW) == {"idle_flagged": 1, "idle_stopped": 0}
        assert idle_check(now=NOW + timedelta(minutes=1))["idle_flagged"] == 0
    mark = JobIdle.objects.get(job=job)
    assert (mark.attempt, mark.max_util_percent, mark.stopped) == (1, 3.0, False)
    job.refresh_from_db()
    assert job.state == "running"
    note = Notification.objects.get(job=job)
    assert note.event == "idle" and "under 5%" in note.text


def test_one_busy_gpu_keeps_the_job_busy() -> None:
    job, gpus = _job()
    _samples(gpus[0], 0.0, since=NOW - timedelta(minutes=61), until=NOW)
    _samples(gpus[1], 0.0, since=NOW - timedelta(minutes=61), until=NOW)
    TelemetrySample.objects.create(
        gpu=gpus[1], sampled_at=NOW - timedelta(minutes=30), util_percent=40, memory_total_mb=1
    )
    assert idle_check(now=NOW)["idle_flagged"] == 0


def test_gpu_the_job_does_not_hold_is_ignored() -> None:
    job, gpus = _job(gpus=1)
    _samples(gpus[0], 0.0, since=NOW - timedelta(minutes=61), until=NOW)
    other = job.node.gpus.get(index=1)
    _samples(other, 99.0, since=NOW - timedelta(minutes=61), until=NOW)
    assert idle_check(now=NOW)["idle_flagged"] == 1


def test_missing_telemetry_is_not_idleness() -> None:
    job, gpus = _job()
    # Readings only over the last 30 minutes of a 60-minute window.
    for gpu in gpus:
        _samples(gpu, 0.0, since=NOW - timedelta(minutes=30), until=NOW)
    assert idle_check(now=NOW)["idle_flagged"] == 0
    # And a window whose readings stopped 20 minutes ago (agent silent).
    job2, gpus2 = _job()
    for gpu in gpus2:
        _samples(gpu, 0.0, since=NOW - timedelta(minutes=61), until=NOW - timedelta(minutes=20))
    assert idle_check(now=NOW)["idle_flagged"] == 0


def test_job_younger_than_window_or_team_off() -> None:
    _, gpus = _job(started_ago=timedelta(minutes=30))
    for gpu in gpus:
        _samples(gpu, 0.0, since=NOW - timedelta(minutes=61), until=NOW)
    _, gpus_off = _job(minutes=0)
    for gpu in gpus_off:
        _samples(gpu, 0.0, since=NOW - timedelta(minutes=61), until=NOW)
    assert idle_check(now=NOW)["idle_flagged"] == 0
    assert not JobIdle.objects.exists()


def test_threshold_and_window_are_the_teams() -> None:
    job, gpus = _job(minutes=10, util=20.0)
    for gpu in gpus:
        _samples(gpu, 15.0, since=NOW - timedelta(minutes=11), until=NOW)
    assert idle_check(now=NOW)["idle_flagged"] == 1


def test_stop_cancels_through_state_machine(
    django_capture_on_commit_callbacks: Any, sent: list[Any]
) -> None:
    job, gpus = _job(action="stop")
    node_name = job.node.name
    for gpu in gpus:
        _samples(gpu, 0.5, since=NOW - timedelta(minutes=61), until=NOW)
    with django_capture_on_commit_callbacks(execute=True):
        assert idle_check(now=NOW) == {"idle_flagged": 1, "idle_stopped": 1}
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert "idle" in job.state_reason and "under 5%" in job.state_reason
    event = JobEvent.objects.filter(job=job).latest("id")
    assert (event.from_state, event.to_state, event.actor_kind) == (
        "running",
        "cancelled",
        "system",
    )
    assert JobIdle.objects.get(job=job).stopped is True
    stops = [s for s in sent if s[0].endswith("stop_job")]
    assert [(s[1], s[2]["job_id"], s[2]["attempt"]) for s in stops] == [
        (f"node.{node_name}", job.pk, 1)
    ]


def test_multi_node_job_reads_every_member() -> None:
    job, gpus = _job(gpus=1)
    node_b: Any = NodeFactory()
    gpu_b = GpuFactory(node=node_b, index=0)
    JobMember.objects.create(job=job, attempt=1, rank=0, node=job.node, gpu_indices=[0])
    JobMember.objects.create(job=job, attempt=1, rank=1, node=node_b, gpu_indices=[0])
    _samples(gpus[0], 0.0, since=NOW - timedelta(minutes=61), until=NOW)
    _samples(gpu_b, 70.0, since=NOW - timedelta(minutes=61), until=NOW)
    assert idle_check(now=NOW)["idle_flagged"] == 0


def test_job_page_shows_idle_badge_for_current_attempt_only() -> None:
    from django.test import Client

    from tests.factories import MembershipFactory

    job, gpus = _job()
    MembershipFactory(user=job.owner, team=job.team)
    web = Client()
    web.force_login(job.owner)
    assert "idle GPUs" not in web.get(f"/jobs/{job.pk}/").content.decode()
    for gpu in gpus:
        _samples(gpu, 0.0, since=NOW - timedelta(minutes=61), until=NOW)
    idle_check(now=NOW)
    assert "idle GPUs" in web.get(f"/jobs/{job.pk}/").content.decode()
    Job.objects.filter(id=job.pk).update(attempt=2)
    assert "idle GPUs" not in web.get(f"/jobs/{job.pk}/").content.decode()


def test_beat_tick_is_scheduled_and_flags_idle_jobs() -> None:
    from django_celery_beat.models import PeriodicTask

    from fleet.tasks import notify_tick

    tick = PeriodicTask.objects.get(task="fleet.tasks.notify_tick")
    assert (tick.enabled, tick.queue, tick.interval.every) == (True, "control", 60)

    job, gpus = _job(minutes=5)
    now = timezone.now()
    for gpu in gpus:
        _samples(gpu, 0.0, since=now - timedelta(minutes=6), until=now)
    result = notify_tick()
    assert result["idle_flagged"] == 1 and result["resent"] == 0
    assert JobIdle.objects.filter(job=job, attempt=1).exists()
