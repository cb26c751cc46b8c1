"""Notifications: settings over REST, webhook delivery to a real HTTP server with retries,
email through Django's mail backend, and the state machine never waiting on an endpoint."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from fleet.celery import app
from fleet.models import Job, Notification, NotificationSettings
from fleet.services import notifications
from fleet.services.job_states import SCHEDULER, job_transition
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/me/notifications/"


class Endpoint:
    """A local webhook receiver: answers `codes` in turn (then 200) and keeps each body."""

    def __init__(self, codes: list[int] | None = None, location: str = "") -> None:
        self.codes = list(codes or [])
        self.bodies: list[dict[str, Any]] = []
        self.gets = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                endpoint.bodies.append(json.loads(self.rfile.read(length)))
                code = endpoint.codes.pop(0) if endpoint.codes else 200
                self.send_response(code)
                if location:
                    self.send_header("Location", location)
                self.end_headers()

            def do_GET(self) -> None:  # what a followed 302 turns a POST into
                endpoint.gets += 1
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def local_webhooks(settings: Any) -> None:
    """The receivers here listen on 127.0.0.1, an internal address fleet refuses by default;
    the tests of that refusal turn it back off."""
    settings.FLEET_WEBHOOK_ALLOW_PRIVATE = True


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    e = Endpoint()
    yield e
    e.close()


@pytest.fixture
def eager() -> Iterator[None]:
    """Celery runs tasks in-process (retries at once, ignoring their countdown)."""
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False


@pytest.fixture
def now_and_after(django_capture_on_commit_callbacks: Any) -> Any:
    """Call a service and run what it queued for after commit (the test's transaction never
    commits)."""

    def call(fn: Any, /, **kwargs: Any) -> Any:
        with django_capture_on_commit_callbacks(execute=True):
            return fn(**kwargs)

    return call


def _running_job(owner: Any, *, started_ago: timedelta = timedelta(minutes=1)) -> Job:
    job: Any = JobFactory(owner=owner, name="train")
    node = NodeFactory(name=f"n{job.pk}")
    Job.objects.filter(id=job.pk).update(
        state="running",
        attempt=1,
        node=node,
        gpu_indices=[0],
        started_at=timezone.now() - started_ago,
    )
    job.refresh_from_db()
    return job


def _assigned_job(owner: Any) -> Job:
    job = _running_job(owner)
    Job.objects.filter(id=job.pk).update(state="assigned", started_at=None)
    return job


# Settings over REST


def test_settings_default_then_saved(owner_api: Any) -> None:
    got = owner_api.get(URL)
    assert got.status_code == 200
    assert got.json()["webhook_url"] == ""
    assert got.json()["events"]["failure"] is True

    put = owner_api.put(
        URL,
        {"webhook_url": "https://hooks.example.org/x", "events": {"start": True, "end": False}},
        format="json",
    )
    assert put.status_code == 200, put.json()
    row = NotificationSettings.objects.get(user=owner_api.user)
    assert (row.webhook_url, row.on_start, row.on_end, row.on_failure) == (
        "https://hooks.example.org/x",
        True,
        False,
        True,
    )
    assert owner_api.get(URL).json()["events"]["start"] is True


@pytest.mark.parametrize("url", ["ftp://host/x", "file:///etc/passwd", "javascript:alert(1)"])
def test_webhook_must_be_http(owner_api: Any, url: str) -> None:
    r = owner_api.put(URL, {"webhook_url": url}, format="json")
    assert r.status_code == 400
    assert "http://" in r.json()["message"]
    assert list(r.json()["extra"]["fields"]) == ["webhook_url"]
    assert not NotificationSettings.objects.filter(user=owner_api.user).exists()


def test_email_needs_an_address(owner_api: Any) -> None:
    owner_api.user.email = ""
    owner_api.user.save()
    r = owner_api.put(URL, {"email": True}, format="json")
    assert r.status_code == 400
    assert "email" in r.json()["message"]


def test_unknown_event_refused(owner_api: Any) -> None:
    r = owner_api.put(URL, {"events": {"explode": True}}, format="json")
    assert r.status_code == 400


def test_anonymous_refused(anon_api: Any) -> None:
    assert anon_api.get(URL).status_code in (401, 403)
    assert anon_api.put(URL, {"email": False}, format="json").status_code in (401, 403)


def test_each_user_sees_only_their_own(owner_api: Any, stranger_api: Any) -> None:
    owner_api.put(URL, {"webhook_url": "https://a.example.org/"}, format="json")
    assert stranger_api.get(URL).json()["webhook_url"] == ""


# Delivery


def test_transition_sends_webhook(
    owner: Any, endpoint: Endpoint, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    NotificationSettings.objects.create(user=owner, webhook_url=endpoint.url, on_start=True)
    job = _assigned_job(owner)
    with django_capture_on_commit_callbacks(execute=True):
        job_transition(job_id=job.pk, action="start", actor=SCHEDULER, reason="started")
    assert len(endpoint.bodies) == 1
    body = endpoint.bodies[0]
    assert body["event"] == "start" and body["job"] == job.pk and body["state"] == "running"
    assert "train" in body["text"] and "started" in body["text"]
    row = Notification.objects.get(job=job)
    assert (row.state, row.tries, row.channel) == ("sent", 1, "webhook")


def test_unwanted_event_sends_nothing(
    owner: Any, endpoint: Endpoint, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    NotificationSettings.objects.create(user=owner, webhook_url=endpoint.url, on_start=False)
    job = _assigned_job(owner)
    with django_capture_on_commit_callbacks(execute=True):
        job_transition(job_id=job.pk, action="start", actor=SCHEDULER)
    assert endpoint.bodies == []
    assert not Notification.objects.exists()


def test_failing_endpoint_retried_then_given_up(
    owner: Any, eager: None, now_and_after: Any
) -> None:
    failing = Endpoint(codes=[500] * 20)
    try:
        NotificationSettings.objects.create(user=owner, webhook_url=failing.url)
        job = _running_job(owner)
        [pk] = now_and_after(
            notifications.notify_job_event, job_id=job.pk, attempt=1, event="failure"
        )
    finally:
        failing.close()
    row = Notification.objects.get(id=pk)
    assert row.state == "failed"
    assert row.tries == notifications.MAX_TRIES
    assert len(failing.bodies) == notifications.MAX_TRIES
    assert "HTTP 500" in row.last_error


def test_endpoint_that_recovers_gets_it_once(owner: Any, eager: None, now_and_after: Any) -> None:
    flaky = Endpoint(codes=[503, 502])
    try:
        NotificationSettings.objects.create(user=owner, webhook_url=flaky.url)
        job = _running_job(owner)
        [pk] = now_and_after(notifications.notify_job_event, job_id=job.pk, attempt=1, event="end")
        # A duplicated delivery message finds the row sent and sends nothing.
        assert notifications.notification_send(notification_id=pk, final=False) is None
    finally:
        flaky.close()
    row = Notification.objects.get(id=pk)
    assert (row.state, row.tries, row.last_error) == ("sent", 3, "")
    assert len(flaky.bodies) == 3


def test_unreachable_endpoint_reason_recorded(owner: Any) -> None:
    closed = Endpoint()
    closed.close()  # nothing listens on its port now
    NotificationSettings.objects.create(user=owner, webhook_url=closed.url)
    job = _running_job(owner)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(notifications, "_enqueue", lambda pk: None)
        [pk] = notifications.notify_job_event(job_id=job.pk, attempt=1, event="end")
    with pytest.raises(notifications.DeliveryFailed):
        notifications.notification_send(notification_id=pk, final=False)
    row = Notification.objects.get(id=pk)
    assert (row.state, row.tries) == ("pending", 1)
    assert "could not reach" in row.last_error
    assert notifications.notification_send(notification_id=pk, final=True) == "failed"


def test_duplicate_event_written_once(
    owner: Any, endpoint: Endpoint, eager: None, now_and_after: Any
) -> None:
    NotificationSettings.objects.create(user=owner, webhook_url=endpoint.url)
    job = _running_job(owner)
    first = now_and_after(notifications.notify_job_event, job_id=job.pk, attempt=1, event="failure")
    second = now_and_after(
        notifications.notify_job_event, job_id=job.pk, attempt=1, event="failure"
    )
    assert len(first) == 1 and second == []
    assert len(endpoint.bodies) == 1
    # The next attempt's failure is news again.
    assert (
        len(
            now_and_after(notifications.notify_job_event, job_id=job.pk, attempt=2, event="failure")
        )
        == 1
    )


def test_email_through_mail_backend(
    owner: Any, eager: None, settings: Any, now_and_after: Any
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    owner.email = "owner@example.org"
    owner.save()
    NotificationSettings.objects.create(user=owner, email=True)
    job = _running_job(owner)
    now_and_after(
        notifications.notify_job_event, job_id=job.pk, attempt=1, event="end", detail="exit 0"
    )
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["owner@example.org"]
    assert "succeeded" in mail.outbox[0].subject and "exit 0" in mail.outbox[0].body
    assert Notification.objects.get(job=job).state == "sent"


def test_transition_commits_without_waiting_on_delivery(
    owner: Any, endpoint: Endpoint, django_capture_on_commit_callbacks: Any
) -> None:
    """The transition's transaction neither sends nor queues: both happen after commit, and
    a broker that refuses the message fails neither the transition nor the notification."""
    NotificationSettings.objects.create(user=owner, webhook_url=endpoint.url)
    job = _running_job(owner)
    queued: list[int] = []

    def broker_down(**kwargs: Any) -> None:
        queued.append(kwargs["kwargs"]["notification_id"])
        raise ConnectionError("broker unreachable")

    with pytest.MonkeyPatch.context() as mp:
        from fleet.tasks import notification_deliver

        mp.setattr(notification_deliver, "apply_async", broker_down)
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            job_transition(job_id=job.pk, action="fail", actor=SCHEDULER, reason="exit 1")
            # Inside the transaction: nothing written, nothing sent.
            assert not Notification.objects.exists()
        assert endpoint.bodies == []
        # The commit: the callbacks run, and what they queue for after commit runs too.
        with django_capture_on_commit_callbacks(execute=True):
            for callback in callbacks:
                callback()
    job.refresh_from_db()
    assert job.state == "failed"
    row = Notification.objects.get(job=job)
    assert row.state == "pending" and queued == [row.pk]
    assert endpoint.bodies == []

    # The periodic tick queues what nobody has tried for a while.
    resent: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(notifications, "_enqueue", resent.append)
        assert notifications.notifications_resend(now=timezone.now()) == 0
        later = timezone.now() + notifications.RESEND_AFTER + timedelta(seconds=1)
        assert notifications.notifications_resend(now=later) == 1
    assert resent == [row.pk]


def test_time_limit_warning_once(
    owner: Any, endpoint: Endpoint, eager: None, now_and_after: Any
) -> None:
    NotificationSettings.objects.create(user=owner, webhook_url=endpoint.url)
    near = _running_job(owner, started_ago=timedelta(minutes=50))  # limit 60 min: 83%
    _running_job(owner, started_ago=timedelta(minutes=30))  # 50%
    now = timezone.now()
    assert now_and_after(notifications.notify_time_limits, now=now) == 1
    assert now_and_after(notifications.notify_time_limits, now=now) == 0
    assert [b["job"] for b in endpoint.bodies] == [near.pk]
    assert endpoint.bodies[0]["event"] == "time_limit"
    assert "min left" in endpoint.bodies[0]["text"]


def test_list_of_deliveries(owner_api: Any, stranger_api: Any) -> None:
    owner = owner_api.user
    NotificationSettings.objects.create(user=owner, webhook_url="http://127.0.0.1:9/x")
    job = _running_job(owner)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(notifications, "_enqueue", lambda pk: None)
        notifications.notify_job_event(job_id=job.pk, attempt=1, event="end")
    got = owner_api.get(URL).json()["recent"]
    assert [(n["job"], n["event"], n["state"]) for n in got] == [(job.pk, "end", "pending")]
    assert stranger_api.get(URL).json()["recent"] == []


# The page


def test_page_saves_and_refuses_bad_url(owner: Any) -> None:
    from django.test import Client

    web = Client()
    web.force_login(owner)
    assert web.get("/notifications/").status_code == 200
    r = web.post("/notifications/", {"webhook_url": "https://h.example.org/x", "on_start": "on"})
    assert r.status_code == 200 and b"Saved." in r.content
    row = NotificationSettings.objects.get(user=owner)
    # Boxes left unticked are off.
    assert (row.webhook_url, row.on_start, row.on_end) == ("https://h.example.org/x", True, False)

    bad = web.post("/notifications/", {"webhook_url": "gopher://h/x", "on_end": "on"})
    assert bad.status_code == 400
    assert b"Nothing was saved" in bad.content and b"gopher://h/x" in bad.content
    row.refresh_from_db()
    assert (row.webhook_url, row.on_end) == ("https://h.example.org/x", False)


def test_page_lists_deliveries_with_reason(owner: Any) -> None:
    from django.test import Client

    job = _running_job(owner)
    Notification.objects.create(
        user=owner,
        job=job,
        attempt=1,
        event="failure",
        channel="webhook",
        target="https://h.example.org/",
        text="t",
        state="failed",
        tries=6,
        last_error="the endpoint answered HTTP 500",
    )
    web = Client()
    web.force_login(owner)
    page = web.get("/notifications/").content.decode()
    assert "failed after 6 tries: the endpoint answered HTTP 500" in page


def test_page_refuses_user_in_no_team(stranger: Any) -> None:
    from django.test import Client

    web = Client()
    web.force_login(stranger)
    assert web.get("/notifications/").status_code == 403
    assert Client().get("/notifications/").status_code == 302


# Internal addresses


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:6379/",
        "http://169.254.169.254/latest/meta-data/",
        "https://10.0.0.5/hook",
        "http://[::1]/x",
        "http://[::ffff:192.168.1.1]/x",
    ],
)
def test_webhook_to_internal_address_refused(owner_api: Any, settings: Any, url: str) -> None:
    settings.FLEET_WEBHOOK_ALLOW_PRIVATE = False
    r = owner_api.put(URL, {"webhook_url": url}, format="json")
    assert r.status_code == 400
    assert "inside fleet's own network" in r.json()["message"]
    assert list(r.json()["extra"]["fields"]) == ["webhook_url"]
    assert not NotificationSettings.objects.filter(user=owner_api.user).exists()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_delivery_to_internal_address_refused(
    owner: Any, endpoint: Endpoint, eager: None, now_and_after: Any, settings: Any, host: str
) -> None:
    """A saved name that now resolves inside the network (or a row written before the
    check) is refused at delivery, and the receiver hears nothing."""
    settings.FLEET_WEBHOOK_ALLOW_PRIVATE = False
    url = endpoint.url.replace("127.0.0.1", host)
    NotificationSettings.objects.create(user=owner, webhook_url=url)
    job = _running_job(owner)
    [pk] = now_and_after(notifications.notify_job_event, job_id=job.pk, attempt=1, event="failure")
    row = Notification.objects.get(pk=pk)
    assert row.state == "failed"
    assert "internal address" in row.last_error
    assert endpoint.bodies == []


def test_redirect_not_followed(owner: Any, eager: None, now_and_after: Any) -> None:
    """An endpoint that redirects cannot send fleet's request elsewhere."""
    target = Endpoint()
    redirecting = Endpoint(codes=[302] * 10, location=target.url)
    try:
        NotificationSettings.objects.create(user=owner, webhook_url=redirecting.url)
        job = _running_job(owner)
        [pk] = now_and_after(
            notifications.notify_job_event, job_id=job.pk, attempt=1, event="failure"
        )
        assert (target.bodies, target.gets) == ([], 0)
        assert "HTTP 302" in Notification.objects.get(pk=pk).last_error
    finally:
        redirecting.close()
        target.close()
