"""/metrics: Prometheus metrics, read from the database at each scrape.

Nothing is counted in process memory: every value comes from PostgreSQL when Prometheus
asks, so any web process answers the same and a restart loses nothing. Each family is one
bounded query (an aggregate, or one row per GPU or node).

GPU readings use DCGM-exporter's names (DCGM_FI_DEV_GPU_UTIL, ...) so dashboards made for
DCGM work unchanged; fleet's own families start with `fleet_`.

Who may scrape: a staff user's API token (`Authorization: Token <key>`), or the token in
FLEET_METRICS_TOKEN sent as `Authorization: Bearer <token>`. No credentials, or ones not
accepted: 401; a valid token of a user who is not staff: 403.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import Count, F, Max, OuterRef, Q, Subquery, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from rest_framework.exceptions import AuthenticationFailed

from fleet.api.auth import HashedTokenAuthentication
from fleet.models import Gpu, Job, JobEvent, JobMember, JobState, Node, TelemetrySample
from fleet.models.jobs import ACTIVE_STATES
from fleet.services.telemetry import BUFFER_KEY, telemetry_refused_key
from scheduler.models import CycleRecord

# A reading older than this is not shown: the GPU's node stopped sending (DCGM-exporter
# likewise shows only what it reads now).
STALE_AFTER = timedelta(minutes=5)
CYCLE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OUTCOMES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
            JobState.LOST)  # fmt: skip
GPU_LABELS = ["node", "gpu", "uuid", "modelName", "job", "team", "user"]
DCGM_FIELDS = (
    ("DCGM_FI_DEV_GPU_UTIL", "util_percent", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "memory_used_mb", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_c", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", "Power draw (in W)."),
)


def _holders() -> dict[tuple[int, int], list[tuple[int, str, str]]]:
    """(node id, GPU index) -> [(job id, team slug, user name)] of assigned or running jobs:
    rank 0 on the job's own node and GPUs, the other members of a multi-node job on theirs."""
    found: set[tuple[int, int, int, str, str]] = set()
    rows = Job.objects.filter(state__in=ACTIVE_STATES, node__isnull=False).values_list(
        "id", "node_id", "gpu_indices", "team__slug", "owner__username"
    )
    for job_id, node_id, indices, team, user in rows:
        found.update((node_id, index, job_id, team, user) for index in indices or [])
    members = JobMember.objects.filter(
        job__state__in=ACTIVE_STATES, attempt=F("job__attempt"), node__isnull=False
    ).values_list("job_id", "node_id", "gpu_indices", "job__team__slug", "job__owner__username")
    for job_id, node_id, indices, team, user in members:
        found.update((node_id, index, job_id, team, user) for index in indices or [])
    out: dict[tuple[int, int], list[tuple[int, str, str]]] = {}
    for node_id, index, job_id, team, user in sorted(found):
        out.setdefault((node_id, index), []).append((job_id, team, user))
    return out


def _joined(values: Iterator[str]) -> str:
    return ",".join(sorted(set(values), key=lambda v: (len(v), v)))


class FleetCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        yield from self._gpus(now)
        yield from self._jobs()
        yield from self._nodes()
        yield from self._cycles()

    def _gpus(self, now: Any) -> Iterator[Metric]:
        families = {
            field: GaugeMetricFamily(name, text, labels=GPU_LABELS)
            for name, field, text in DCGM_FIELDS
        }
        lag = GaugeMetricFamily(
            "fleet_telemetry_lag_seconds",
            "Age of the newest stored GPU reading of each node (how far ingest is behind).",
            labels=["node"],
        )
        # The newest sample of each GPU: one index seek per GPU on (gpu, sampled_at).
        newest = TelemetrySample.objects.filter(gpu=OuterRef("pk")).order_by("-sampled_at")
        gpus = Gpu.objects.annotate(sample_id=Subquery(newest.values("id")[:1])).values_list(
            "id", "node_id", "node__name", "index", "uuid", "model", "sample_id"
        )
        gpu_rows = list(gpus)
        samples = {
            s["id"]: s
            for s in TelemetrySample.objects.filter(
                id__in=[r[6] for r in gpu_rows if r[6] is not None]
            ).values("id", "sampled_at", *(f for _, f, _ in DCGM_FIELDS))
        }
        holders = _holders()
        newest_by_node: dict[str, Any] = {}
        for _, node_id, node, index, uuid, model, sample_id in gpu_rows:
            sample = samples.get(sample_id)
            if sample is None:
                continue
            at = sample["sampled_at"]
            if node not in newest_by_node or at > newest_by_node[node]:
                newest_by_node[node] = at
            if now - at > STALE_AFTER:
                continue
            held = holders.get((node_id, index), [])
            labels = [
                node, str(index), uuid, model, _joined(str(h[0]) for h in held),
                _joined(h[1] for h in held), _joined(h[2] for h in held),
            ]  # fmt: skip
            for _, field, _ in DCGM_FIELDS:
                if sample[field] is not None:
                    families[field].add_metric(labels, float(sample[field]))
        for node, at in sorted(newest_by_node.items()):
            lag.add_metric([node], max(0.0, (now - at).total_seconds()))
        yield from families.values()
        yield lag
        yield from self._ingest()

    def _ingest(self) -> Iterator[Metric]:
        """Readings waiting in Redis for the next batch write, and readings refused on
        arrival per node and field. Left out while Redis does not answer."""
        nodes = list(Node.objects.order_by("name").values_list("name", flat=True))
        try:
            client = cache._cache.get_client()  # type: ignore[attr-defined]
            buffered = client.llen(cache.make_key(BUFFER_KEY))
            with client.pipeline(transaction=False) as pipe:
                for name in nodes:
                    pipe.hgetall(telemetry_refused_key(name))
                refused = dict(zip(nodes, pipe.execute(), strict=True))
        except Exception:
            return
        yield GaugeMetricFamily(
            "fleet_telemetry_buffered_samples",
            "GPU readings received and not yet written to the history.",
            value=buffered,
        )
        family = CounterMetricFamily(
            "fleet_telemetry_refused",
            "GPU readings refused on arrival (out of range, wrong type), by node and field.",
            labels=["node", "field"],
        )
        for name, counts in refused.items():
            for field, count in sorted(counts.items()):
                field = field.decode() if isinstance(field, bytes) else str(field)
                if field != "total":
                    family.add_metric([name, field], int(count))
        yield family

    def _jobs(self) -> Iterator[Metric]:
        queue = GaugeMetricFamily(
            "fleet_jobs",
            "Jobs waiting or holding GPUs now, by state and team.",
            labels=["state", "team"],
        )
        live = [JobState.PENDING, JobState.HELD, JobState.ASSIGNED, JobState.RUNNING,
                JobState.LOST]  # fmt: skip
        rows = (
            Job.objects.filter(state__in=live)
            .values("state", "team__slug")
            .annotate(n=Count("id"))
            .order_by("state", "team__slug")
        )
        for row in rows:
            queue.add_metric([row["state"], row["team__slug"]], row["n"])
        yield queue
        # Every applied transition into an outcome is an event row: a count that only grows
        # (a requeued job's earlier failure still happened).
        finished = CounterMetricFamily(
            "fleet_jobs_finished",
            "Attempts that ended, by outcome (succeeded, failed, cancelled, timeout, lost).",
            labels=["outcome"],
        )
        counts = dict(
            JobEvent.objects.filter(applied=True, to_state__in=OUTCOMES)
            .exclude(from_state=F("to_state"))
            .values("to_state")
            .annotate(n=Count("id"))
            .values_list("to_state", "n")
        )
        for outcome in OUTCOMES:
            finished.add_metric([outcome], counts.get(outcome, 0))
        yield finished

    def _nodes(self) -> Iterator[Metric]:
        nodes = GaugeMetricFamily("fleet_nodes", "Nodes by state.", labels=["state"])
        counts = dict(
            Node.objects.values("state").annotate(n=Count("id")).values_list("state", "n")
        )
        for state, n in sorted(counts.items()):
            nodes.add_metric([state], n)
        yield nodes

    def _cycles(self) -> Iterator[Metric]:
        # Only the latest cycles are kept (scheduler/cycle/runner.py), so their durations form
        # a gauge histogram over those; the cycle count uses the ever-growing record id.
        buckets = {
            f"le_{i}": Count("id", filter=Q(duration_ms__lte=b * 1000))
            for i, b in enumerate(CYCLE_BUCKETS_S)
        }
        agg = CycleRecord.objects.aggregate(
            n=Count("id"), total_ms=Sum("duration_ms"), last_id=Max("id"),
            last_at=Max("finished_at"), **buckets,
        )  # fmt: skip
        hist = GaugeHistogramMetricFamily(
            "fleet_scheduler_cycle_duration_seconds",
            "Duration of the most recent scheduling cycles (those kept in the database).",
            buckets=[(str(b), agg[f"le_{i}"]) for i, b in enumerate(CYCLE_BUCKETS_S)]
            + [("+Inf", agg["n"])],
            gsum_value=(agg["total_ms"] or 0.0) / 1000,
        )
        yield hist
        yield CounterMetricFamily(
            "fleet_scheduler_cycles", "Scheduling cycles run.", value=agg["last_id"] or 0
        )
        last = GaugeMetricFamily(
            "fleet_scheduler_last_cycle_timestamp_seconds", "When the last cycle finished."
        )
        if agg["last_at"] is not None:
            last.add_metric([], agg["last_at"].timestamp())
        yield last


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(FleetCollector())


def _allowed(request: HttpRequest) -> int:
    """200 when the caller may scrape, else the status to answer."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, credential = header.partition(" ")
    if scheme.lower() == "bearer":
        expected = os.environ.get("FLEET_METRICS_TOKEN", "")
        ok = bool(expected) and hmac.compare_digest(credential.strip().encode(), expected.encode())
        return 200 if ok else 401
    user = None
    if scheme.lower() == "token":
        try:
            found = HashedTokenAuthentication().authenticate(request)
        except AuthenticationFailed:
            return 401
        user = found[0] if found else None
    elif getattr(request, "user", None) is not None and request.user.is_authenticated:
        user = request.user  # a staff member's browser session
    if user is None:
        return 401
    return 200 if user.is_staff else 403


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    status = _allowed(request)
    if status == 401:
        response = JsonResponse(
            {
                "message": "Send a staff user's token ('Authorization: Token <key>') or "
                "the metrics token ('Authorization: Bearer <FLEET_METRICS_TOKEN>').",
                "extra": {},
            },
            status=401,
        )
        response["WWW-Authenticate"] = 'Bearer realm="fleet metrics"'
        return response
    if status == 403:
        return JsonResponse(
            {"message": "Only staff may read the metrics.", "extra": {}}, status=403
        )
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
