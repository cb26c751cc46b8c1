"""Hypothesis strategies for random but consistent snapshots.

Running jobs are drawn first and GPU free capacity is derived from them, so a snapshot
never claims a GPU is free while a running job holds it.
"""

from __future__ import annotations

from types import MappingProxyType

from hypothesis import strategies as st

from scheduler.core.model import (
    FULL_COMPUTE,
    GpuState,
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
        nodes.append(NodeState(name, gpus, schedulable=draw(st.booleans()) or n == 0))
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


def _with_fraction(job: RunningJob, mem: int, comp: int) -> RunningJob:
    from dataclasses import replace

    return replace(job, gpus=0, gpu_memory_mb=mem, gpu_compute_percent=comp)


def _pending(draw: st.DrawFn, job_id: int, now: float) -> PendingJob:
    fractional = draw(st.integers(0, 3)) == 0
    limit = float(draw(st.integers(60, 100_000)))
    return PendingJob(
        id=job_id,
        team=draw(st.sampled_from(TEAMS)),
        user=draw(st.sampled_from(USERS)),
        submitted_at=now - draw(st.integers(0, 100_000)),
        time_limit=limit,
        gpus=0 if fractional else draw(st.sampled_from([1, 1, 2, 3, 4, 8, 16])),
        gpu_memory_mb=draw(st.integers(1000, 90_000)) if fractional else None,
        gpu_compute_percent=draw(st.integers(1, 100)) if fractional else None,
        gpu_model=draw(st.none() | st.sampled_from(sorted(MODELS))),
        min_gpu_memory_mb=draw(st.none() | st.sampled_from([16384, 24576, 40000])),
        priority=draw(st.integers(-5, 5)),
        qos=draw(st.sampled_from(["low", "normal", "high"])),
        predicted_runtime=draw(st.none() | st.floats(10, limit)),
        attained_service=float(draw(st.integers(0, 400_000))),
    )
