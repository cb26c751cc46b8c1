"""Where simulated jobs come from: the Philly trace, a generic CSV/JSON format, the fleet's
own recorded jobs (the `fleet` CSV that `manage.py export_trace` writes), a generator.

Every loader returns jobs sorted by submit time (stable), numbered 1..n in that order, with
submit times in seconds relative to the earliest job.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.sim.jobs import JobSpec

FORMATS = ("philly", "csv", "json", "fleet", "auto")

# The fleet trace (`manage.py export_trace`, `GET /api/v1/advisor/trace.csv`): one row per
# recorded job. `submit` is an ISO time; `runtime` the seconds its last attempt ran (what it
# needs alone); `nodes` must equal gpus / gpus_per_node for a gang; `started` and `finished`
# are what happened (ISO times), kept for reference and not replayed.
FLEET_COLUMNS = (
    "id", "name", "submit", "runtime", "gpus", "gpus_per_node", "nodes", "gpu_model", "gpu_memory_mb",
    "gpu_compute_percent", "cpus", "memory_mb", "team", "user", "priority", "qos",
    "preemptible", "time_limit", "state", "started", "finished",
)  # fmt: skip


def load_jobs(path: str | Path, fmt: str = "auto") -> list[JobSpec]:
    path = Path(path)
    if fmt == "auto":
        if path.suffix.lower() in (".json", ".jsonl"):
            fmt = "json"
        else:
            with path.open(newline="") as fh:
                header = fh.readline()
            if "num_gpus" in header and "cluster" in header:
                fmt = "philly"
            elif "runtime" in header and "preemptible" in header:
                fmt = "fleet"
            else:
                fmt = "csv"
    if fmt == "philly":
        return load_philly(path)
    if fmt == "fleet":
        return load_fleet(path)[0]
    if fmt == "csv":
        with path.open(newline="") as fh:
            return _generic(list(csv.DictReader(fh)), str(path))
    if fmt == "json":
        text = path.read_text()
        if path.suffix.lower() == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
            rows = data["jobs"] if isinstance(data, dict) else data
        return _generic(rows, str(path))
    raise ValueError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")


def _number(text: str) -> float:
    return float(text) if text else 0.0


def load_philly(path: str | Path) -> list[JobSpec]:
    """The Philly trace (timestamp, duration, num_gpus, gpu_time, cluster).

    The virtual cluster is the team; there is no user column, so the user is the team too.
    """
    raw: list[tuple[float, float, int, str]] = []
    with Path(path).open(newline="") as fh:
        for row in csv.DictReader(fh):
            ts = datetime.fromisoformat(row["timestamp"]).timestamp()
            raw.append((ts, _number(row["duration"]), int(float(row["num_gpus"])), row["cluster"]))
    raw.sort(key=lambda r: r[0])
    t0 = raw[0][0] if raw else 0.0
    return [
        JobSpec(id=i, submit=ts - t0, duration=d, gpus=g, team=c, user=c)
        for i, (ts, d, g, c) in enumerate(raw, start=1)
    ]


def _time(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text).timestamp()


def _opt_int(value: Any) -> int | None:
    if value is None or value == "":
        return None
    return int(float(value))


CHECKPOINTED_WORDS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _opt_checkpointed(value: Any, where: str, n: int) -> bool | None:
    """The `checkpointed` column: true/false (1/0, yes/no), or empty for the run's default."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if not text:
        return None
    if text not in CHECKPOINTED_WORDS:
        raise ValueError(
            f"{where}: row {n}: checkpointed={value!r}; give true or false, or leave it empty "
            "for the run's --checkpointing"
        )
    return CHECKPOINTED_WORDS[text]


def _opt_speeds(value: Any, where: str, n: int) -> tuple[tuple[str, float], ...]:
    """The `speeds` column: relative speed per GPU model, `V100=1.0;K80=0.3` (or a JSON
    object in JSON traces); empty: every model at 1.0."""
    if value is None or value == "":
        return ()
    items = (
        list(value.items())
        if isinstance(value, dict)
        else [part.partition("=")[::2] for part in str(value).split(";") if part.strip()]
    )
    out = []
    for model, speed in items:
        try:
            number = float(speed)
        except (TypeError, ValueError):
            number = 0.0
        if not str(model).strip() or not (number > 0 and math.isfinite(number)):
            raise ValueError(
                f"{where}: row {n}: speeds={value!r}; give MODEL=SPEED pairs with speeds "
                "above 0, e.g. V100=1.0;K80=0.3"
            )
        out.append((str(model).strip(), number))
    return tuple(sorted(out))


def _generic(rows: list[dict[str, Any]], where: str) -> list[JobSpec]:
    """Generic rows: submit, duration, gpus, team, user, name; time_limit, gpu_model,
    gpu_memory_mb, gpu_compute_percent, priority, gpus_per_node, cpus, memory_mb (host memory
    per node, MiB), checkpointed (whether a preemption keeps its progress; empty: the run's
    --checkpointing), speeds (relative speed per GPU model, `V100=1.0;K80=0.3`; `duration`
    is then the runtime at speed 1.0) optional. `submit` is seconds or an ISO time."""
    parsed = []
    for n, row in enumerate(rows, start=1):
        try:
            submit = _time(row["submit"])
            duration = float(row["duration"])
            gpus = int(float(row.get("gpus", 1) or 0))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{where}: row {n}: needs submit, duration and gpus ({exc})")
        per_node = _opt_int(row.get("gpus_per_node")) or 0
        if per_node < 0 or (per_node and gpus % per_node):
            raise ValueError(
                f"{where}: row {n}: gpus_per_node {per_node} must divide gpus {gpus} "
                "(a gang takes the same GPUs on each of its nodes)"
            )
        team = str(row.get("team") or "default")
        limit = row.get("time_limit") or None
        fields: dict[str, Any] = dict(
            duration=duration,
            gpus=gpus,
            team=team,
            user=str(row.get("user") or team),
            name=str(row.get("name") or ""),
            time_limit=float(limit) if limit is not None else None,
            gpu_model=row.get("gpu_model") or None,
            gpu_memory_mb=_opt_int(row.get("gpu_memory_mb")),
            gpu_compute_percent=_opt_int(row.get("gpu_compute_percent")),
            priority=_opt_int(row.get("priority")) or 0,
            gpus_per_node=_opt_int(row.get("gpus_per_node")) or 0,
            cpus=_opt_int(row.get("cpus")) or 0,
            memory_mb=_opt_int(row.get("memory_mb")) or 0,
            checkpointed=_opt_checkpointed(row.get("checkpointed"), where, n),
            speeds=_opt_speeds(row.get("speeds"), where, n),
        )
        parsed.append((submit, fields))
    parsed.sort(key=lambda p: p[0])
    t0 = parsed[0][0] if parsed else 0.0
    return [JobSpec(id=i, submit=s - t0, **kw) for i, (s, kw) in enumerate(parsed, start=1)]


def load_fleet(path: str | Path) -> tuple[list[JobSpec], frozenset[int]]:
    """A fleet trace: the jobs, and the ids of those that may not be preempted."""
    with Path(path).open(newline="") as fh:
        return fleet_jobs(list(csv.DictReader(fh)), str(path))


def _flag(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "t", "y")


def fleet_jobs(
    rows: list[dict[str, Any]], where: str = "fleet trace"
) -> tuple[list[JobSpec], frozenset[int]]:
    """Fleet rows (FLEET_COLUMNS) as jobs numbered 1..n by submit time, and the ids of the jobs
    that are not preemptible (JobSpec has no such field: the advisor marks them in every
    snapshot; the command line treats every job as preemptible)."""
    generic: list[tuple[float, dict[str, Any], bool]] = []
    for n, row in enumerate(rows, start=1):
        try:
            submit = _time(row["submit"])
            gpus = int(float(row["gpus"] or 0))
            per_node = _opt_int(row.get("gpus_per_node")) or 0
            nodes = _opt_int(row.get("nodes")) or 1
            runtime = float(row["runtime"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{where}: row {n}: needs submit, runtime and gpus ({exc})")
        if nodes > 1 and per_node * nodes != gpus:
            raise ValueError(
                f"{where}: row {n}: {nodes} nodes of {per_node} GPUs do not make {gpus} GPUs"
            )
        fields = {
            **row,
            "submit": submit,
            "duration": runtime,
            "gpus": gpus,
            "gpus_per_node": per_node if nodes > 1 else 0,
        }
        generic.append((submit, fields, _flag(row.get("preemptible", "true"))))
    # _generic numbers jobs in a stable sort by submit time: sort first to know the ids.
    generic.sort(key=lambda g: g[0])
    fixed = frozenset(i for i, (_, _, may) in enumerate(generic, start=1) if not may)
    return _generic([f for _, f, _ in generic], where), fixed


# Philly's shape: median duration 1,144 s and mean 13,136 s give a lognormal with
# sigma = sqrt(2 ln(mean / median)); GPU counts in the trace's proportions (1, 2, 4, 8, 16).
PHILLY_MEDIAN_S = 1144.0
PHILLY_MEAN_S = 13136.0
PHILLY_GPU_COUNTS = (1, 2, 4, 8, 16)
PHILLY_GPU_WEIGHTS = (76627, 1818, 1870, 1643, 285)


def synthetic(
    n_jobs: int,
    *,
    total_gpus: int,
    load: float = 0.7,
    n_teams: int = 8,
    seed: int = 0,
    max_gpus: int | None = 8,
) -> list[JobSpec]:
    """Poisson arrivals at the rate that offers `load` x `total_gpus` of GPU work.

    Durations are lognormal with Philly's median and mean (clipped to 30 s .. 30 days),
    GPU counts follow Philly's mix (counts above `max_gpus` left out), teams are Zipf-weighted.
    """
    rng = np.random.default_rng(seed)
    sigma = math.sqrt(2 * math.log(PHILLY_MEAN_S / PHILLY_MEDIAN_S))
    durations = np.clip(rng.lognormal(math.log(PHILLY_MEDIAN_S), sigma, n_jobs), 30, 30 * 86400)
    pairs = [
        (c, w)
        for c, w in zip(PHILLY_GPU_COUNTS, PHILLY_GPU_WEIGHTS, strict=True)
        if max_gpus is None or c <= max_gpus
    ]
    counts = np.array([c for c, _ in pairs])
    weights = np.array([w for _, w in pairs], dtype=float)
    gpus = rng.choice(counts, size=n_jobs, p=weights / weights.sum())
    mean_work = float(np.mean(durations * gpus))
    rate = load * total_gpus / mean_work  # jobs per second
    gaps = rng.exponential(1.0 / rate, n_jobs)
    gaps[0] = 0.0
    submits = np.cumsum(gaps)
    team_w = 1.0 / np.arange(1, n_teams + 1)
    teams = rng.choice(n_teams, size=n_jobs, p=team_w / team_w.sum())
    return [
        JobSpec(
            id=i + 1,
            submit=float(submits[i]),
            duration=float(round(durations[i])),
            gpus=int(gpus[i]),
            team=f"team-{teams[i]}",
            user=f"team-{teams[i]}",
        )
        for i in range(n_jobs)
    ]
