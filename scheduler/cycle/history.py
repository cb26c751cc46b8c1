"""What recent finished jobs teach the snapshot: runtime predictions and the size
distributions (`learn_history`), and gavel's speed table (`learn_speeds`). Both are kept
between cycles while what they were learned from is the same."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from fleet.models import Job, JobState
from scheduler.core.prediction import RuntimePredictor, limit_class
from scheduler.core.service_distribution import summarize
from scheduler.cycle.snapshot_jobs import epoch, seconds_or
from scheduler.cycle.snapshot_rows import version_column, writing_transaction
from scheduler.cycle.usage import gpu_equivalent
from scheduler.policies.gavel import SpeedLearner, speed_key

# Finished states whose runtime says how long such a job really takes.
HISTORY_STATES = (JobState.SUCCEEDED, JobState.TIMEOUT)


@dataclass(frozen=True)
class History:
    """What recent finished jobs teach: runtime ratios per owner and name (predictions), and
    the size distributions `gittins` ranks by (GPU-seconds; runtime / time limit)."""

    predictor: RuntimePredictor
    service: tuple[float, ...] = ()
    limit_ratio: tuple[float, ...] = ()
    # (owner id, name, time limit) -> prediction, filled as snapshots ask.
    predictions: dict[tuple[int, str, int], float | None] = field(
        default_factory=dict, compare=False
    )
    # (owner id, name, time-limit class) -> the learned ratio: the limits of one script's
    # jobs differ, but seldom by more than a class.
    ratios: dict[tuple[int, str, int], float] = field(default_factory=dict, compare=False)

    def predict(self, owner: int, name: str, limit: int) -> float | None:
        """`predictor.predict(str(owner), name, float(limit))`, bit for bit (the ratio times
        the limit), the ratio asked once per owner, name and limit class."""
        if self.predictor.observations() == 0:
            return None
        key = (owner, name, limit)
        try:
            return self.predictions[key]
        except KeyError:
            kind = (owner, name, limit_class(limit))
            ratio = self.ratios.get(kind)
            if ratio is None:
                ratio = self.ratios[kind] = self.predictor.ratio(str(owner), name, float(limit))
            value = self.predictions[key] = ratio * max(float(limit), 0.0)
            return value


# The last history learned, with the fingerprint of the rows it was learned from.
_history_cache: dict[str, tuple[str, History]] = {}
_HISTORY_COLUMNS = (
    "owner_id", "name", "time_limit", "gpus", "gpu_compute_percent", "started_at", "finished_at",
)  # fmt: skip


def _history_fingerprint(recent: Any) -> str | None:
    """An md5 of the rows `recent` reads, computed by PostgreSQL (one short row back instead
    of thousands); None elsewhere. Of each row's id and version (`xmin`: any write gives a
    row a new one, see scheduler.cycle.snapshot_rows), or inside a transaction that has
    written, where versions cannot tell its own writes apart, of the columns learned from."""
    if connection.vendor != "postgresql":
        return None
    if writing_transaction():
        kind, columns = "c", list[Any](_HISTORY_COLUMNS)
    else:
        kind, columns = "v", [version_column()]
    sql, params = recent.values_list("id", *columns).query.sql_with_params()
    names = [f"c{i}" for i in range(len(columns) + 1)]  # the id, then the columns
    fields = ", ".join(f"coalesce({n}::text, '-')" for n in names)  # a NULL stays in place
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT md5(string_agg(concat_ws('|', {fields}), ',' ORDER BY c0)) "
            f"FROM ({sql}) AS r({', '.join(names)})",
            params,
        )
        found = cursor.fetchone()
    if found is None:
        return None
    return f"{kind}:" if found[0] is None else f"{kind}:{found[0]}"  # empty: none finished yet


def learn_history(limit: int) -> History:
    """Learn from the `limit` most recent finished jobs (keyed by owner id).

    On PostgreSQL, when those rows read the same as at the last call (an md5 of them,
    computed by the database), the history of that call is returned, with the predictions
    it has made: a finished job's row seldom changes, and reading and learning 5,000 of them
    every cycle cost more than the rest of the snapshot's pending jobs."""
    if limit <= 0:
        return History(RuntimePredictor())
    recent = Job.objects.filter(
        state__in=HISTORY_STATES, started_at__isnull=False, finished_at__isnull=False
    ).order_by("-id")[:limit]
    fingerprint = _history_fingerprint(recent)
    cached = _history_cache.get("last")
    if fingerprint is not None and cached is not None and cached[0] == fingerprint:
        return cached[1]
    predictor = RuntimePredictor()
    rows = recent.values_list(
        "owner_id", "name", "time_limit", "gpus", "gpu_compute_percent",
        epoch("started_at"), epoch("finished_at"),
    )  # fmt: skip
    sizes: list[float] = []
    ratios: list[float] = []
    for owner, name, limit_s, gpus, comp, started, finished in reversed(list(rows)):
        runtime = max(0.0, seconds_or(finished, 0.0) - seconds_or(started, 0.0))
        predictor.update(str(owner), name, float(limit_s), runtime)
        sizes.append(runtime * gpu_equivalent(gpus, comp))
        ratios.append(min(runtime / float(limit_s), 1.0))
    history = History(predictor, summarize(sizes), summarize(ratios))
    if fingerprint is not None:
        _history_cache["last"] = (fingerprint, history)
    return history


# Seconds a learned speed table is used before finished jobs are read for it again.
SPEED_TABLE_TTL = 300.0
_speed_cache: dict[str, tuple[int, float, Mapping[str, Mapping[str, float]]]] = {}


def learn_speeds(
    limit: int, models: Mapping[tuple[int, int], str], *, now: float
) -> Mapping[str, Mapping[str, float]]:
    """Relative speed per job class and GPU model (gavel's `SpeedLearner`), from the `limit`
    most recent finished jobs that ran in one attempt on GPUs of one model (`models`: (node
    id, GPU index) -> model). Read again at most every SPEED_TABLE_TTL seconds."""
    cached = _speed_cache.get("table")
    if cached is not None and cached[0] == limit and 0 <= now - cached[1] < SPEED_TABLE_TTL:
        return cached[2]
    learner = SpeedLearner()
    rows = (
        Job.objects.filter(
            state__in=HISTORY_STATES, requeues=0, node__isnull=False,
            started_at__isnull=False, finished_at__isnull=False,
        )
        .order_by("-id")
        .values_list(
            "owner__username", "name", "time_limit", "node_id", "gpu_indices", "gpus",
            "gpus_per_node", epoch("started_at"), epoch("finished_at"),
        )[: max(limit, 0)]
    )  # fmt: skip
    for user, name, limit_s, node_id, indices, gpus, per_node, started, finished in rows:
        if per_node and gpus > per_node:
            continue  # a gang's other members may have run on other models
        kinds = {models.get((node_id, int(i))) for i in indices or ()}
        model = kinds.pop() if len(kinds) == 1 else None
        if model is not None and limit_s:
            runtime = seconds_or(finished, 0.0) - seconds_or(started, 0.0)
            learner.observe(speed_key(user or "", name), model, runtime, float(limit_s))
    table = learner.table()
    _speed_cache["table"] = (limit, now, table)
    return table
