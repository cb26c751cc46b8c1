"""What a telemetry value may be: the type and range of every field an agent sends.

Pure: no Django. `sample_check` takes one GPU's reading from a telemetry message and
returns it cleaned (only the known fields, each converted to its type), or the reason it
was refused. A reading is kept whole or refused whole: one value that is not a finite
number of the right type within its range (Infinity, NaN, -50 %, -273 °C, 10**30, a
string) makes the whole reading suspect. `value_ok` answers the same question for one
value that is already stored, so readers can leave out what an older version let in.

The ranges are wide enough for any GPU made so far and narrow enough that the database
columns hold every value and charts stay readable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

MAX_MEMORY_MB = 4 * 1024 * 1024  # 4 TiB: far above any GPU's memory
MAX_PROCESSES = 1024  # compute processes on one GPU, in one reading
MAX_SAMPLES = 1024  # GPU readings in one message
MAX_JOBS = 1024  # per-job usage entries in one message
MAX_PID = 2**31 - 1
MAX_ID = 2**63 - 1
MAX_SKEW_S = 86400.0  # a reading's time may differ this much from when it arrives


class Bounds(NamedTuple):
    kind: type  # int or float
    low: float
    high: float


# Optional fields: None (or absent) where the GPU does not report the value.
BOUNDS: dict[str, Bounds] = {
    "util_percent": Bounds(float, 0, 100),
    "memory_util_percent": Bounds(float, 0, 100),
    # NVML: a fan speed may exceed 100 % of the rated speed in some cases.
    "fan_percent": Bounds(float, 0, 200),
    "temperature_c": Bounds(float, 0, 150),
    "power_w": Bounds(float, 0, 10_000),
    "power_limit_w": Bounds(float, 0, 10_000),
    "sm_clock_mhz": Bounds(int, 0, 10_000),
    "mem_clock_mhz": Bounds(int, 0, 50_000),
    "memory_used_mb": Bounds(int, 0, MAX_MEMORY_MB),
    "memory_total_mb": Bounds(int, 1, MAX_MEMORY_MB),
    "ecc_errors": Bounds(int, 0, 10**12),
    "xid_errors": Bounds(int, 0, 10**12),
    "index": Bounds(int, 0, 1023),
}
REQUIRED = ("uuid", "memory_total_mb")


class Refused(ValueError):
    """A value, reading or message that is not kept. `field` names what was wrong; it is
    also the name the per-node counter of refused readings uses."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field


def number(value: Any, bounds: Bounds, field: str) -> int | float:
    """`value` as a number of the field's kind within its range, or Refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Refused(field, f"{type(value).__name__} is not a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Refused(field, f"{value} is not a finite number")
        if bounds.kind is int:
            if not value.is_integer():
                raise Refused(field, f"{value} is not a whole number")
            value = int(value)
    if not bounds.low <= value <= bounds.high:
        shown = value if abs(value) < 1e15 else f"{value:.3g}"
        raise Refused(field, f"{shown} is outside {bounds.low:g}..{bounds.high:g}")
    return bounds.kind(value)  # type: ignore[no-any-return]


def value_ok(field: str, value: Any) -> bool:
    """Whether a stored value of `field` is one a reader may show: None, or a finite
    number within the field's range (an average of whole numbers need not be whole)."""
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    bounds = BOUNDS[field]
    return bounds.low <= value <= bounds.high


def _processes(value: Any, memory_total_mb: int) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_PROCESSES:
        raise Refused("processes", f"not a list of at most {MAX_PROCESSES} processes")
    out = []
    for proc in value:
        if not isinstance(proc, Mapping):
            raise Refused("processes", f"{type(proc).__name__} is not a process")
        used = proc.get("used_memory_mb")
        job_id = proc.get("job_id")
        out.append(
            {
                "pid": number(proc.get("pid"), Bounds(int, 0, MAX_PID), "processes"),
                "used_memory_mb": None
                if used is None
                else number(used, Bounds(int, 0, memory_total_mb), "processes"),
                "job_id": None
                if job_id is None
                else number(job_id, Bounds(int, 0, MAX_ID), "processes"),
            }
        )
    return out


def _throttle_reasons(value: Any) -> list[str]:
    if value is None:
        return []
    if (
        not isinstance(value, list)
        or len(value) > 64
        or not all(isinstance(r, str) and len(r) <= 64 for r in value)
    ):
        raise Refused("throttle_reasons", "not a list of short names")
    return list(value)


def sample_check(raw: Any, *, now_s: float) -> dict[str, Any]:
    """One GPU reading, cleaned: every field of BOUNDS (None where not reported),
    `uuid`, `sampled_at` (seconds; `now_s` when the reading has none), `throttle_reasons`
    and `processes`. Raises Refused naming the first field that is wrong."""
    if not isinstance(raw, Mapping):
        raise Refused("sample", f"{type(raw).__name__} is not a GPU reading")
    for name in REQUIRED:
        if raw.get(name) is None:
            raise Refused(name, "missing")
    uuid = raw["uuid"]
    if not isinstance(uuid, str) or not 0 < len(uuid) <= 100:
        raise Refused("uuid", "not a GPU uuid")
    clean: dict[str, Any] = {"uuid": uuid}
    for name, bounds in BOUNDS.items():
        value = raw.get(name)
        clean[name] = None if value is None else number(value, bounds, name)
    if clean["memory_used_mb"] is not None and clean["memory_used_mb"] > clean["memory_total_mb"]:
        raise Refused("memory_used_mb", "more than memory_total_mb")
    at = raw.get("sampled_at")
    clean["sampled_at"] = (
        now_s
        if at is None
        else number(at, Bounds(float, now_s - MAX_SKEW_S, now_s + MAX_SKEW_S), "sampled_at")
    )
    clean["throttle_reasons"] = _throttle_reasons(raw.get("throttle_reasons"))
    clean["processes"] = _processes(raw.get("processes"), clean["memory_total_mb"])
    return clean


def job_usage_check(job_id: Any, usage: Any) -> tuple[str, dict[str, Any]]:
    """One entry of a message's per-job usage: (job id as text, {"memory_mb",
    "gpu_indices"}), or Refused."""
    if not isinstance(job_id, str) or not job_id.isdigit() or len(job_id) > 19:
        raise Refused("jobs", "a job id is not a number")
    if not isinstance(usage, Mapping):
        raise Refused("jobs", f"{type(usage).__name__} is not a job's usage")
    indices = usage.get("gpu_indices") or []
    if not isinstance(indices, list) or len(indices) > 1024:
        raise Refused("jobs", "gpu_indices is not a list")
    return job_id, {
        "memory_mb": number(
            usage.get("memory_mb", 0), Bounds(int, 0, MAX_MEMORY_MB * 1024), "jobs"
        ),
        "gpu_indices": [number(i, BOUNDS["index"], "jobs") for i in indices],
    }
