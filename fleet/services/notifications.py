"""Notifications of job events: settings, what to send, and delivery.

The state machine calls `notify_on_commit` inside a transition; nothing happens until that
transaction commits, and then only rows are written and a delivery task is queued (without
broker retries), so a slow or failing endpoint never slows or fails a transition. Each
delivery is its own Celery task, retried with exponential backoff a bounded number of times
(fleet/tasks.py), with a short HTTP timeout. A row that is still pending long after its last
try (its message was lost with Redis or a dying worker) is queued again by the periodic tick.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import socket
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from fleet.errors import ApplicationError
from fleet.models import Job, JobState, Notification, NotificationEvent, NotificationSettings
from fleet.models.notifications import Channel, Delivery

log = logging.getLogger(__name__)

E = NotificationEvent
# Which transitions users hear about (the names of fleet/services/job_states.py).
EVENT_OF_ACTION: dict[str, str] = {
    "start": E.START,
    "succeed": E.END,
    "succeed_late": E.END,
    "fail": E.FAILURE,
    "time_out": E.FAILURE,
    "lose": E.FAILURE,
    "fail_lost": E.FAILURE,
    "preempt": E.REQUEUE,
    "requeue": E.REQUEUE,
    "recover": E.REQUEUE,
}
EVENT_FIELDS = {f"on_{e.value}": e for e in E}

HTTP_TIMEOUT = 5.0  # seconds: a delivery task never waits longer on one endpoint
MAX_TRIES = 6  # the first try and five retries, 10 s to 160 s apart
RESEND_AFTER = timedelta(minutes=15)  # longer than every backoff together
TIME_LIMIT_SHARE = 0.8


class DeliveryFailed(Exception):
    """One try failed; the message says why (kept on the row)."""


def webhook_url_check(url: str) -> str:
    """The URL, stripped, or an ApplicationError saying what is wrong with it."""
    url = url.strip()
    if not url:
        return ""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ApplicationError(
            "The webhook URL must start with http:// or https://; "
            f"'{parts.scheme or url}' cannot receive a POST from fleet.",
            {"fields": {"webhook_url": ["Use an http:// or https:// URL."]}},
        )
    if not parts.hostname:
        raise ApplicationError(
            "The webhook URL has no host name; write it as https://host/path.",
            {"fields": {"webhook_url": ["The URL has no host."]}},
        )
    if len(url) > 500:
        raise ApplicationError(
            "The webhook URL is longer than 500 characters.",
            {"fields": {"webhook_url": ["At most 500 characters."]}},
        )
    try:
        literal = ipaddress.ip_address(parts.hostname)
    except ValueError:
        literal = None  # a name: checked where it resolves, at each delivery
    if literal is not None and _internal(literal):
        raise ApplicationError(
            f"The webhook URL points at {literal}, an address inside fleet's own network; "
            "use a public endpoint (an admin can allow internal ones with "
            "FLEET_WEBHOOK_ALLOW_PRIVATE=1).",
            {"fields": {"webhook_url": ["Internal addresses are not allowed."]}},
        )
    return url


def _internal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Loopback, private, link-local and other non-public addresses, unless allowed."""
    if settings.FLEET_WEBHOOK_ALLOW_PRIVATE:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_global or address.is_multicast


def _check_destination(url: str) -> None:
    """Refuse a delivery whose host resolves to an internal address (the name may have
    changed what it points at since it was saved)."""
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise DeliveryFailed(f"could not resolve {host}: {e}") from e
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if _internal(address):
            raise DeliveryFailed(
                f"{host} resolves to {address}, an internal address; fleet does not post "
                "there unless FLEET_WEBHOOK_ALLOW_PRIVATE=1"
            )


def settings_get(*, user: Any) -> NotificationSettings:
    """The user's settings, or the defaults (unsaved) when they never chose."""
    found = NotificationSettings.objects.filter(user_id=user.pk).first()
    return found if found is not None else NotificationSettings(user=user)


def settings_update(*, user: Any, data: dict[str, Any]) -> NotificationSettings:
    """Save the fields given in `data` (the others keep their values)."""
    if data.get("email") and not user.email:
        raise ApplicationError(
            "Your account has no email address; ask an admin to add one, or use a webhook.",
            {"fields": {"email": ["No email address on your account."]}},
        )
    changes: dict[str, Any] = {}
    if "webhook_url" in data:
        changes["webhook_url"] = webhook_url_check(str(data["webhook_url"] or ""))
    for field in ("email", *EVENT_FIELDS):
        if field in data:
            changes[field] = bool(data[field])
    with transaction.atomic():
        row, _ = NotificationSettings.objects.select_for_update().get_or_create(user=user)
        for field, value in changes.items():
            setattr(row, field, value)
        row.save()
    return row


def _text(job: Job, event: str, detail: str) -> str:
    what = {
        E.START: "started",
        E.END: "succeeded",
        E.FAILURE: f"ended {job.state}",
        E.TIME_LIMIT: "has used 80% of its time limit",
        E.REQUEUE: "was put back in the queue",
        E.IDLE: "has idle GPUs",
    }[E(event)]
    node = f" on {job.node.name}" if job.node_id and job.node else ""
    line = f"fleet: job {job.pk} '{job.name}' ({job.team.slug}){node} {what}"
    return f"{line}: {detail}" if detail else line


def notify_on_commit(*, job_id: int, attempt: int, action: str, reason: str) -> None:
    """Called by the state machine inside a transition: after commit, notify the job's owner
    of the event the transition means (if any, and if they asked for it)."""
    event = EVENT_OF_ACTION.get(action)
    if event is None:
        return

    def run() -> None:
        notify_job_event(job_id=job_id, attempt=attempt, event=event, detail=reason)

    transaction.on_commit(run, robust=True)


def notify_many_on_commit(*, transitions: list[tuple[int, int, int, str, str]]) -> None:
    """`notify_on_commit` for many transitions of one transaction, each (job id, owner id,
    attempt, action, reason): after commit the owners' settings are read with one query,
    and only the jobs whose owners asked for the event are notified (a batch of preemptions
    need not read every job and its owner's settings one by one)."""
    wanted = [
        (job_id, owner_id, attempt, EVENT_OF_ACTION[action], reason)
        for job_id, owner_id, attempt, action, reason in transitions
        if action in EVENT_OF_ACTION
    ]
    if not wanted:
        return

    def run() -> None:
        prefs = {
            p.user_id: p
            for p in NotificationSettings.objects.filter(user_id__in={w[1] for w in wanted})
        }
        for job_id, owner_id, attempt, event, reason in wanted:
            chosen = prefs.get(owner_id)
            if chosen is None or not chosen.wants(event):
                continue
            try:
                notify_job_event(job_id=job_id, attempt=attempt, event=event, detail=reason)
            except Exception:
                # (as a failing callback of its own would: the others still go out)
                log.exception("could not notify the owner of job %s", job_id)

    transaction.on_commit(run, robust=True)


def notify_job_event(*, job_id: int, attempt: int, event: str, detail: str = "") -> list[int]:
    """Write one notification per channel the owner chose for `event`, once per attempt,
    and queue their delivery. Returns the ids of the rows written now."""
    job = Job.objects.select_related("owner", "team", "node").filter(id=job_id).first()
    if job is None:
        return []
    prefs = NotificationSettings.objects.filter(user_id=job.owner_id).first()
    if prefs is None or not prefs.wants(event):
        return []
    targets: list[tuple[str, str]] = []
    if prefs.webhook_url:
        targets.append((Channel.WEBHOOK, prefs.webhook_url))
    if prefs.email and job.owner.email:
        targets.append((Channel.EMAIL, job.owner.email))
    text = _text(job, event, detail)
    written: list[int] = []
    for channel, target in targets:
        try:
            with transaction.atomic():
                row = Notification.objects.create(
                    user_id=job.owner_id,
                    job=job,
                    attempt=attempt,
                    event=event,
                    channel=channel,
                    target=target,
                    text=text,
                )
        except IntegrityError:
            continue  # already written for this attempt: a duplicate, nothing to send
        written.append(row.pk)
        transaction.on_commit(functools.partial(_enqueue, row.pk), robust=True)
    return written


def _enqueue(notification_id: int) -> None:
    from fleet.tasks import notification_deliver

    try:
        # No broker retries: with Redis away this must not hold the caller; the periodic
        # tick queues the still-pending row again.
        notification_deliver.apply_async(kwargs={"notification_id": notification_id}, retry=False)
    except Exception:
        log.warning("could not queue notification %s; the tick will", notification_id)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a new destination: following it would let an endpoint
    send fleet's request to an address the check above refused."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _post(url: str, payload: dict[str, Any]) -> None:
    _check_destination(url)
    body = json.dumps(payload).encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with _OPENER.open(request, timeout=HTTP_TIMEOUT) as response:
            response.read(1024)
    except urllib.error.HTTPError as e:
        raise DeliveryFailed(f"the endpoint answered HTTP {e.code}") from e
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise DeliveryFailed(f"could not reach the endpoint: {reason}") from e


def notification_send(*, notification_id: int, final: bool) -> str | None:
    """Try to deliver one pending notification once; return its state afterwards (None when
    it is not pending: sent already, or given up).

    The row is locked while it is sent, so a duplicated task waits or skips and never sends
    twice. A failed try is recorded; on the `final` try the row becomes failed, otherwise
    DeliveryFailed is raised for the task to retry.
    """
    with transaction.atomic():
        row = (
            Notification.objects.select_for_update(skip_locked=True)
            .select_related("job")
            .filter(id=notification_id, state=Delivery.PENDING)
            .first()
        )
        if row is None:
            return None
        row.tries += 1
        try:
            if row.channel == Channel.WEBHOOK:
                _post(
                    row.target,
                    {
                        "text": row.text,
                        "event": row.event,
                        "job": row.job_id,
                        "attempt": row.attempt,
                        "state": row.job.state,
                    },
                )
            else:
                send_mail(
                    subject=row.text[:120],
                    message=row.text,
                    from_email=settings.DEFAULT_FROM_EMAIL,
                    recipient_list=[row.target],
                )
        except Exception as e:
            row.last_error = str(e)[:500]
            if final:
                row.state = Delivery.FAILED
            row.save(update_fields=["tries", "last_error", "state", "updated_at"])
            if final:
                return row.state
            failure = DeliveryFailed(row.last_error)
        else:
            row.state = Delivery.SENT
            row.sent_at = timezone.now()
            row.last_error = ""
            row.save(update_fields=["tries", "last_error", "state", "sent_at", "updated_at"])
            return row.state
    # Raised after the commit, so the failed try stays recorded.
    raise failure


def notifications_resend(*, now: datetime) -> int:
    """Queue again the pending rows nobody has tried for RESEND_AFTER (their message was
    lost). Returns how many."""
    ids = list(
        Notification.objects.filter(
            state=Delivery.PENDING, updated_at__lt=now - RESEND_AFTER
        ).values_list("id", flat=True)[:500]
    )
    for pk in ids:
        _enqueue(pk)
    return len(ids)


def notify_time_limits(*, now: datetime) -> int:
    """Notify owners who asked, once per attempt, of running jobs past 80% of their time
    limit. Returns how many notifications were written."""
    jobs = Job.objects.filter(
        state=JobState.RUNNING,
        started_at__isnull=False,
        owner__notification_settings__on_time_limit=True,
    ).values_list("id", "attempt", "started_at", "time_limit")
    written = 0
    for job_id, attempt, started_at, limit in jobs:
        if started_at is None:
            continue
        if started_at + timedelta(seconds=limit * TIME_LIMIT_SHARE) <= now:
            left = int((started_at + timedelta(seconds=limit) - now).total_seconds() // 60)
            detail = f"about {left} min left" if left > 0 else ""
            written += len(
                notify_job_event(job_id=job_id, attempt=attempt, event=E.TIME_LIMIT, detail=detail)
            )
    return written
