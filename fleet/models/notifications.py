"""What a user wants to hear about their jobs, what was sent, and idle GPUs seen on jobs.

A notification row is written once per (user, job, attempt, event, channel), so a duplicated
transition or a second look by the periodic check never sends twice. Each row records its
delivery: pending until sent, or failed with the reason once its retries are spent.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class NotificationEvent(models.TextChoices):
    START = "start", "started"
    END = "end", "succeeded"
    FAILURE = "failure", "failed, timed out or lost"
    TIME_LIMIT = "time_limit", "reached 80% of its time limit"
    REQUEUE = "requeue", "preempted or requeued"
    IDLE = "idle", "GPUs idle"


class NotificationSettings(models.Model):
    """One user's choices: where to send (a webhook, their email) and which events."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_settings"
    )
    webhook_url = models.CharField(
        max_length=500, blank=True, help_text="http(s) URL that receives a JSON POST."
    )
    email = models.BooleanField(default=False, help_text="Also send to the user's email.")
    on_start = models.BooleanField(default=False)
    on_end = models.BooleanField(default=True)
    on_failure = models.BooleanField(default=True)
    on_time_limit = models.BooleanField(default=True)
    on_requeue = models.BooleanField(default=True)
    on_idle = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"notifications of {self.user}"

    def wants(self, event: str) -> bool:
        return bool(getattr(self, f"on_{event}", False))


class Channel(models.TextChoices):
    WEBHOOK = "webhook", "webhook"
    EMAIL = "email", "email"


class Delivery(models.TextChoices):
    PENDING = "pending", "pending"
    SENT = "sent", "sent"
    FAILED = "failed", "failed"


class Notification(models.Model):
    """One message to one user over one channel, and how its delivery went."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications"
    )
    job = models.ForeignKey("fleet.Job", on_delete=models.CASCADE, related_name="notifications")
    attempt = models.PositiveIntegerField()
    event = models.CharField(max_length=20, choices=NotificationEvent.choices)
    channel = models.CharField(max_length=10, choices=Channel.choices)
    target = models.CharField(max_length=500, help_text="The URL or address it went to.")
    text = models.TextField()
    state = models.CharField(max_length=10, choices=Delivery.choices, default=Delivery.PENDING)
    tries = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "job", "attempt", "event", "channel"], name="notification_once"
            )
        ]
        indexes = [
            models.Index(fields=["user", "-created_at"]),
            models.Index(fields=["state", "updated_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.event} of job {self.job_id}.{self.attempt} by {self.channel}: {self.state}"


class JobIdle(models.Model):
    """An attempt whose GPUs stayed under its team's idle threshold for its idle window."""

    job = models.ForeignKey("fleet.Job", on_delete=models.CASCADE, related_name="idle_marks")
    attempt = models.PositiveIntegerField()
    detected_at = models.DateTimeField()
    max_util_percent = models.FloatField(help_text="Highest utilization seen in the window.")
    minutes = models.PositiveIntegerField(help_text="The window, in minutes.")
    stopped = models.BooleanField(default=False, help_text="The job was cancelled for it.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt"], name="job_idle_once_per_attempt")
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}.{self.attempt} idle since {self.detected_at:%Y-%m-%d %H:%M}"
