"""What agents send back besides job states: GPU telemetry history and job output.

Telemetry is kept twice: raw samples for a short window (FLEET_TELEMETRY_RAW_RETENTION)
and one-minute rollups for longer (FLEET_TELEMETRY_ROLLUP_RETENTION), so the tables stay
bounded as the fleet grows. The latest sample of each GPU lives in the cache, not here.
Job output arrives in capped chunks (see fleet/services/telemetry_logs.py).
"""

from __future__ import annotations

from django.db import models

from fleet.models.jobs import Job
from fleet.models.nodes import Gpu


class TelemetrySample(models.Model):
    """One reading of one GPU, as the agent sampled it."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples")
    sampled_at = models.DateTimeField()
    util_percent = models.FloatField(null=True)
    memory_used_mb = models.IntegerField(null=True)
    memory_total_mb = models.IntegerField()
    temperature_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)
    sm_clock_mhz = models.IntegerField(null=True)

    class Meta:
        indexes = [
            models.Index(fields=["gpu", "sampled_at"]),
            models.Index(fields=["sampled_at"]),
        ]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} at {self.sampled_at:%Y-%m-%d %H:%M:%S}"


class TelemetryRollup(models.Model):
    """One minute of one GPU: averages and maxima over the raw samples in it."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="rollups")
    minute = models.DateTimeField(help_text="Start of the minute.")
    samples = models.PositiveIntegerField()
    util_percent = models.FloatField(null=True)
    util_percent_max = models.FloatField(null=True)
    memory_used_mb = models.FloatField(null=True)
    memory_used_mb_max = models.IntegerField(null=True)
    memory_total_mb = models.IntegerField()
    temperature_c = models.FloatField(null=True)
    temperature_c_max = models.FloatField(null=True)
    power_w = models.FloatField(null=True)
    power_w_max = models.FloatField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["gpu", "minute"], name="telemetry_rollup_unique")
        ]
        indexes = [models.Index(fields=["minute"])]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} minute {self.minute:%Y-%m-%d %H:%M}"


class JobLogChunk(models.Model):
    """A piece of one attempt's output: bytes [offset, offset + len(data)) of its log.

    `eof` marks the attempt's last chunk (the agent sends it once the job has ended).
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    attempt = models.PositiveIntegerField()
    # The member that wrote it (0 for a single-node job).
    rank = models.PositiveSmallIntegerField(default=0)
    offset = models.BigIntegerField()
    end = models.BigIntegerField(help_text="offset + the chunk's length in bytes")
    data = models.BinaryField()
    eof = models.BooleanField(default=False)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "attempt", "rank", "offset"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "rank", "offset"], name="job_log_chunk_unique_rank"
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}.{self.attempt} rank {self.rank} log at {self.offset}"
