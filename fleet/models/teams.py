"""Teams, memberships and API tokens."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q

DAY = 24 * 3600


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True)
    priority_weight = models.FloatField(
        default=1.0, help_text="Multiplies the team's job priority."
    )
    fairshare_weight = models.FloatField(
        default=1.0, help_text="Share of the fleet for fair-share scheduling."
    )
    guaranteed_gpus = models.PositiveIntegerField(
        default=0, help_text="GPUs the team is guaranteed (its quota)."
    )
    gpu_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Hard limit: quota plus what the team may borrow. Empty: no limit.",
    )
    user_gpu_cap = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPUs one member may use at once. Empty: no cap."
    )
    cpu_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Hard limit on host CPU cores the team's running jobs hold. Empty: no limit.",
    )
    memory_mb_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Hard limit on host memory (MB) the team's running jobs hold. Empty: no limit.",
    )
    default_time_limit = models.PositiveIntegerField(default=4 * 3600, help_text="Seconds.")
    max_time_limit = models.PositiveIntegerField(default=7 * DAY, help_text="Seconds.")
    cpus_per_gpu = models.PositiveIntegerField(
        default=0,
        help_text="Host CPU cores a job gets per GPU on each node when it does not ask. 0: none.",
    )
    memory_mb_per_gpu = models.PositiveIntegerField(
        default=0,
        help_text="Host memory (MB) a job gets per GPU on each node when it does not ask. 0: none.",
    )
    idle_util_percent = models.FloatField(
        default=5.0, help_text="A job's GPUs under this utilization (%) count as idle."
    )
    idle_minutes = models.PositiveIntegerField(
        default=60, help_text="Minutes of idle GPUs before a job is flagged. 0: off."
    )
    idle_action = models.CharField(
        max_length=10,
        choices=[("warn", "warn"), ("stop", "stop")],
        default="warn",
        help_text="warn: flag and notify; stop: also cancel the job.",
    )

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=Q(priority_weight__gt=0), name="team_priority_weight_positive"
            ),
            models.CheckConstraint(
                condition=Q(fairshare_weight__gt=0), name="team_fairshare_weight_positive"
            ),
            models.CheckConstraint(
                condition=Q(gpu_limit__isnull=True) | Q(gpu_limit__gte=F("guaranteed_gpus")),
                name="team_limit_covers_quota",
            ),
            models.CheckConstraint(
                condition=Q(default_time_limit__gt=0)
                & Q(default_time_limit__lte=F("max_time_limit")),
                name="team_default_time_limit_within_max",
            ),
            models.CheckConstraint(
                condition=Q(cpu_limit__isnull=True) | Q(cpu_limit__gt=0),
                name="team_cpu_limit_positive",
            ),
            models.CheckConstraint(
                condition=Q(memory_mb_limit__isnull=True) | Q(memory_mb_limit__gt=0),
                name="team_memory_mb_limit_positive",
            ),
            models.CheckConstraint(
                condition=Q(idle_util_percent__gte=0, idle_util_percent__lte=100),
                name="team_idle_util_percent_range",
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    MEMBER = "member", "member"
    ADMIN = "admin", "admin"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    is_default = models.BooleanField(default=False, help_text="The team used when none is given.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="membership_unique"),
            models.UniqueConstraint(
                fields=["user"], condition=Q(is_default=True), name="membership_one_default"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ApiToken(models.Model):
    """A user's API token. Only its SHA-256 is stored; the key is shown once."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_token"
    )
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8, help_text="First characters, to tell tokens apart.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"
