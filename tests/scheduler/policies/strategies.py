"""Hypothesis strategies for random but consistent snapshots.

Running jobs are drawn first and GPU free capacity is derived from them, so a snapshot
never claims a GPU is free while a running job holds it; host CPUs and memory likewise.
Nodes may report host CPUs and memory (or not) and sit in topology groups; running and
pending jobs include multi-node gangs and jobs asking for host CPUs and memory.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from scheduler.core.model import (
    FULL_COMPUTE,
    GpuState,
    Member,
    NodeState,
    PendingJob,
    RunningJob,
    Snapshot,
    TeamState,
)

MODELS = {"A100": 81920, "V100": 16384, "L4": 24576}
TEAMS = ("vision", "nlp", "speech")
USERS = ("ada", "bob", "cy")


@st.composite
def snapshots(draw: st.DrawFn, max_nodes: int = 4, max_pending: int = 14) -> Snapshot:
    now = 100_000.0
    job_ids = iter(range(1, 10_000))
    nodes, running = [], []
    for n in range(draw(st.integers(1, max_nodes))):
        model = draw(st.sampled_from(sorted(MODELS)))
        size = draw(st.sampled_from([1, 2, 4, 8]))
        mem = [MODELS[model]] * size
        comp = [FULL_COMPUTE] * size
        name = f"n{n}"
        g = 0
        while g < size:
            what = draw(st.sampled_from(["free", "free", "whole", "fraction"]))
            if what == "whole":
                span = draw(st.integers(1, size - g))
                indices = tuple(range(g, g + span))
                for i in indices:
                    mem[i], comp[i] = 0, 0
                running.append(_running(draw, next(job_ids), name, indices, span, now))
                g += span
                continue
            if what == "fraction":
                for _ in range(draw(st.integers(1, 3))):
                    need_mem = draw(st.integers(1000, MODELS[model] // 2))
                    need_comp = draw(st.integers(5, 60))
                    if need_mem <= mem[g] and need_comp <= comp[g]:
                        mem[g] -= need_mem
                        comp[g] -= need_comp
                        job = _running(draw, next(job_ids), name, (g,), 0, now)
                        running.append(_with_fraction(job, need_mem, need_comp))
            g += 1
        gpus = tuple(
            GpuState(i, model, MODELS[model], free_memory_mb=mem[i], free_compute_percent=comp[i])
            for i in range(size)
        )
        reports = draw(st.booleans())
        cpus = draw(st.sampled_from([8, 16, 64])) if reports else None
        memory = draw(st.sampled_from([32768, 131072])) if reports else None
        free_cpus, free_memory = cpus, memory
        for i, job in enumerate(running):
            if job.node == name and reports:
                take_cpus = min(free_cpus or 0, draw(st.sampled_from([0, 2, 8])))
                take_mem = min(free_memory or 0, draw(st.sampled_from([0, 4096, 16384])))
                running[i] = replace(job, cpus=take_cpus, memory_mb=take_mem)
                free_cpus = (free_cpus or 0) - take_cpus
                free_memory = (free_memory or 0) - take_mem
        nodes.append(
            NodeState(
                name,
                gpus,
                schedulable=draw(st.booleans()) or n == 0,
                cpus=cpus,
                memory_mb=memory,
                free_cpus=free_cpus,
                free_memory_mb=free_memory,
                group=draw(st.sampled_from(["", "r1", "r1", "r2"])),
            )
        )
    if draw(st.booleans()):
        _add_running_gang(draw, nodes, running, next(job_ids), now)
    teams = {}
    for slug in TEAMS:
        teams[slug] = TeamState(
            slug,
            guaranteed_gpus=draw(st.integers(0, 6)),
            hard_limit_gpus=draw(st.none() | st.integers(1, 16)),
            user_gpu_cap=draw(st.none() | st.integers(1, 8)),
            priority_weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
            fairshare_weight=draw(st.sampled_from([1.0, 2.0, 3.0])),
            decayed_usage=draw(st.floats(0, 1e6)),
        )
    pending = [_pending(draw, next(job_ids), now) for _ in range(draw(st.integers(0, max_pending)))]
    settings = {
        "qos_preemption": draw(st.booleans()),
        "priority_reservation": draw(st.booleans()),
        "backfill_order": draw(st.sampled_from(["priority", "submit"])),
        "backfill_use_predictions": draw(st.booleans()),
    }
    return Snapshot(
        now=now,
        nodes=tuple(nodes),
        running=tuple(running),
        pending=tuple(pending),
        teams=MappingProxyType(teams),
        settings=MappingProxyType(settings),
    )


def _running(draw: st.DrawFn, job_id: int, node: str, indices, gpus: int, now: float):
    return RunningJob(
        id=job_id,
        team=draw(st.sampled_from(TEAMS)),
        user=draw(st.sampled_from(USERS)),
        node=node,
        gpu_indices=indices,
        started_at=now - draw(st.integers(0, 50_000)),
        time_limit=float(draw(st.integers(3_600, 200_000))),
        gpus=gpus,
        qos=draw(st.sampled_from(["low", "normal", "high"])),
        preemptible=draw(st.booleans()),
        requeueable=draw(st.booleans()),
        attained_service=float(draw(st.integers(0, 500_000))),
    )


def _add_running_gang(draw: st.DrawFn, nodes: list, running: list, job_id: int, now: float):
    """A running gang of one member on each of two nodes with wholly free GPUs of a kind."""
    per = draw(st.sampled_from([1, 2]))
    by_kind: dict[tuple[str, int], list[int]] = {}
    for pos, node in enumerate(nodes):
        free = [g for g in node.gpus if g.is_whole_free]
        if len(free) >= per:
            by_kind.setdefault((free[0].model, free[0].memory_mb), []).append(pos)
    spans = [positions[:2] for positions in by_kind.values() if len(positions) >= 2]
    if not spans:
        return
    members = []
    for pos in draw(st.sampled_from(spans)):
        node = nodes[pos]
        indices = tuple(g.index for g in node.gpus if g.is_whole_free)[:per]
        gpus = tuple(
            replace(g, free_memory_mb=0, free_compute_percent=0) if g.index in indices else g
            for g in node.gpus
        )
        nodes[pos] = replace(node, gpus=gpus)
        members.append(Member(node.name, indices))
    job = _running(draw, job_id, members[0].node, members[0].gpu_indices, 2 * per, now)
    running.append(replace(job, members=tuple(members[1:]), gpus_per_node=per))


def _with_fraction(job: RunningJob, mem: int, comp: int) -> RunningJob:
    return replace(job, gpus=0, gpu_memory_mb=mem, gpu_compute_percent=comp)


def _pending(draw: st.DrawFn, job_id: int, now: float) -> PendingJob:
    fractional = draw(st.integers(0, 3)) == 0
    limit = float(draw(st.integers(60, 100_000)))
    per = 0 if fractional else draw(st.sampled_from([0, 0, 0, 1, 2, 4, 8]))
    gpus = 0 if fractional else draw(st.sampled_from([1, 1, 2, 3, 4, 8, 16]))
    if per:
        gpus = per * draw(st.integers(1, 3))
    return PendingJob(
        id=job_id,
        team=draw(st.sampled_from(TEAMS)),
        user=draw(st.sampled_from(USERS)),
        submitted_at=now - draw(st.integers(0, 100_000)),
        time_limit=limit,
        gpus=gpus,
        gpus_per_node=per,
        cpus=draw(st.sampled_from([0, 0, 2, 8, 32])),
        memory_mb=draw(st.sampled_from([0, 0, 8192, 65536])),
        same_group=draw(st.integers(0, 3)) == 0,
        gpu_memory_mb=draw(st.integers(1000, 90_000)) if fractional else None,
        gpu_compute_percent=draw(st.integers(1, 100)) if fractional else None,
        gpu_model=draw(st.none() | st.sampled_from(sorted(MODELS))),
        min_gpu_memory_mb=draw(st.none() | st.sampled_from([16384, 24576, 40000])),
        priority=draw(st.integers(-5, 5)),
        qos=draw(st.sampled_from(["low", "normal", "high"])),
        predicted_runtime=draw(st.none() | st.floats(10, limit)),
        attained_service=float(draw(st.integers(0, 400_000))),
    )


# The queue-walking policies, and the checks the cycle's property tests run them with.
WALKING_POLICIES = [
    "fcfs",
    "priority",
    "sjf",
    "fairshare",
    "backfill",
    "las",
    "gittins",
    "gittins-tiers",
    "tiresias",
]
CYCLE_CHECKS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def with_settings(snapshot: Snapshot, **extra: object) -> Snapshot:
    """The snapshot with these settings added."""
    return replace(snapshot, settings=MappingProxyType({**snapshot.settings, **extra}))


def no_guarantees(snapshot: Snapshot) -> Snapshot:
    """No team guarantee and no QoS preemption: the walk may settle early."""
    teams = {t: replace(s, guaranteed_gpus=0) for t, s in snapshot.teams.items()}
    return replace(
        snapshot,
        teams=MappingProxyType(teams),
        settings=MappingProxyType({**snapshot.settings, "qos_preemption": False}),
    )


@st.composite
def busy_snapshots(draw: st.DrawFn) -> Snapshot:
    """Up to 40 pending jobs; half of them without guarantees or QoS preemption, so that
    the walk often settles early and records much of the queue at once."""
    snap = draw(snapshots(max_nodes=4, max_pending=40))
    return no_guarantees(snap) if draw(st.booleans()) else snap
