"""The scheduler's own rows: its settings, a record of each cycle, decayed team usage and the
queue's order."""

from __future__ import annotations

from uuid import uuid4

from django.core.validators import MinValueValidator
from django.db import models

from fleet.models import Team

DEFAULT_POLICY = "gittins-tiers"
DEFAULT_TICK_SECONDS = 10


class SchedulerSettings(models.Model):
    """One row (pk 1): the active policy, its parameters and the tick interval.

    A change takes effect at the next cycle, which reads this row afresh.
    """

    policy = models.CharField(max_length=50, default=DEFAULT_POLICY)
    params = models.JSONField(
        default=dict,
        blank=True,
        help_text="Policy parameters: weights, fairshare_half_life (s), preemption, "
        "ilp_time_limit (s)... Unknown keys are refused.",
    )
    tick_seconds = models.PositiveIntegerField(
        default=DEFAULT_TICK_SECONDS,
        validators=[MinValueValidator(1)],
        help_text="Seconds between periodic cycles (besides those that submissions, "
        "finishes and node changes trigger).",
    )
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        verbose_name = "scheduler settings"
        verbose_name_plural = "scheduler settings"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(tick_seconds__gte=1), name="scheduler_tick_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.policy}, every {self.tick_seconds} s"


class CycleRecord(models.Model):
    """What one scheduling cycle did; only the most recent ones are kept."""

    started_at = models.DateTimeField(db_index=True)
    finished_at = models.DateTimeField()
    duration_ms = models.FloatField()
    policy = models.CharField(max_length=50)
    pending = models.PositiveIntegerField(default=0)
    running = models.PositiveIntegerField(default=0)
    placed = models.PositiveIntegerField(default=0)
    preempted = models.PositiveIntegerField(default=0)
    reserved = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(
        default=0, help_text="Decisions whose job or GPUs changed since the snapshot."
    )
    # Milliseconds per step (snapshot, policy, apply, waits).
    timings = models.JSONField(default=dict, blank=True)
    notes = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"cycle {self.pk} ({self.policy}, {self.placed} placed)"


class TeamUsage(models.Model):
    """A team's GPU-seconds, decayed with the configured half-life, as of `as_of`.

    Each cycle decays the stored value by the time since `as_of` and adds what ran in
    between, so no cycle reads the whole job history.
    """

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="usage")
    decayed_gpu_seconds = models.FloatField(default=0.0)
    as_of = models.DateTimeField()

    class Meta:
        verbose_name_plural = "team usage"

    def __str__(self) -> str:
        return f"{self.team_id}: {self.decayed_gpu_seconds:.0f} GPU-s"


class QueueOrder(models.Model):
    """One row (pk 1): the jobs still waiting after the last cycle, in the active policy's
    order, and why each waits; pages and the API read queue positions and wait reasons from
    it (scheduler.cycle.queue_order)."""

    # The job ids in order, and for each the index of its reason in `reasons` (the distinct
    # reasons): packed integers (scheduler.cycle.queue_order), a tenth of the time of a JSON
    # list of 10,000 numbers to write and to read.
    ids = models.BinaryField(default=bytes)
    reason_index = models.BinaryField(default=bytes)
    reasons = models.JSONField(default=list)
    # A new value on every write: readers keep what they parsed while it is the same.
    token = models.UUIDField(default=uuid4)
    written_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{len(self.ids) // 8} waiting jobs, as of {self.written_at}"


class TableGeneration(models.Model):
    """Per table, a number that changes whenever any statement writes the table: a
    PostgreSQL trigger (migration 0006) sets it from a sequence, so a value is never given
    twice, even by a transaction that rolled back. A process that kept what it read of the
    table knows it is still current while the number reads the same, whoever wrote (a
    service, an admin, psql). Only tables that change seldom have one (the GPU inventory);
    only PostgreSQL keeps them."""

    table = models.CharField(max_length=100, primary_key=True)
    value = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.table}: {self.value}"
