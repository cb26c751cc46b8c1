"""Plan checker and snapshot builders for the packing-policy tests (no tests here).

`check_plan` applies the invariants shared by all policies (each pending job placed or
waiting with a reason exactly once, gangs on wholly free GPUs of one node, fractions within
each GPU's free memory and compute, model and memory constraints, team hard limits and
per-user caps) and the packing-specific ones.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from scheduler.core.model import (
    FULL_COMPUTE,
    GpuState,
    NodeState,
    PendingJob,
    Plan,
    RunningJob,
    Snapshot,
    TeamState,
)
from tests.scheduler.invariants import assert_plan_valid

PACKING = ("greedy", "ilp", "genetic", "annealing")


def check_plan(snapshot: Snapshot, plan: Plan) -> None:
    """The shared invariants (tests/scheduler/invariants.py), plus what packing adds:
    a gang uses one GPU kind, and a fraction only a GPU with the memory it asks for."""
    assert_plan_valid(snapshot, plan)
    pending = {j.id: j for j in snapshot.pending}
    nodes = {n.name: n for n in snapshot.nodes}
    for place in plan.places:
        job = pending[place.job_id]
        gpus = {g.index: g for g in nodes[place.node].gpus}
        kinds = {(gpus[i].model, gpus[i].memory_mb) for i in place.gpu_indices}
        assert len(kinds) == 1, f"job {job.id} spans GPU kinds {kinds}"
        if job.is_fractional:
            gpu = gpus[place.gpu_indices[0]]
            assert (job.gpu_memory_mb or 0) <= min(gpu.free_memory_mb, gpu.memory_mb)


def plan_value(plan: Plan, values: dict[int, float]) -> float:
    return sum(values[p.job_id] for p in plan.places)


def gang(job_id: int, gpus: int, **kw: Any) -> PendingJob:
    base: dict[str, Any] = {"team": "t", "user": "u", "submitted_at": 0.0, "time_limit": 3600.0}
    base.update(kw)
    return PendingJob(id=job_id, gpus=gpus, **base)


def fraction(job_id: int, memory_mb: int, compute: int, **kw: Any) -> PendingJob:
    base: dict[str, Any] = {"team": "t", "user": "u", "submitted_at": 0.0, "time_limit": 3600.0}
    base.update(kw)
    return PendingJob(
        id=job_id, gpus=0, gpu_memory_mb=memory_mb, gpu_compute_percent=compute, **base
    )


def idle_node(name: str, gpus: int, model: str = "a100", memory_mb: int = 40_000) -> NodeState:
    return NodeState(name, tuple(GpuState(i, model, memory_mb, memory_mb) for i in range(gpus)))


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    """Small random fleets (mixed models, busy, partly used and free GPUs, down nodes),
    pending gangs and fractions with constraints, and teams with limits and caps."""
    teams = {}
    for slug in ("vision", "speech", "nlp"):
        teams[slug] = TeamState(
            slug,
            hard_limit_gpus=draw(st.one_of(st.none(), st.integers(0, 12))),
            user_gpu_cap=draw(st.one_of(st.none(), st.integers(0, 6))),
            priority_weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
        )
    users = ("ann", "bob", "cy")
    nodes, running = [], []
    run_id = 10_000
    for n in range(draw(st.integers(1, 5))):
        size = draw(st.sampled_from([1, 2, 4, 8]))
        model, memory = draw(
            st.sampled_from([("a100", 40_000), ("a100", 80_000), ("h100", 80_000)])
        )
        gpus = []
        for i in range(size):
            state = draw(st.sampled_from(["free", "free", "busy", "partial"]))
            if state == "free":
                gpus.append(GpuState(i, model, memory, memory))
                continue
            run_id += 1
            team, user = draw(st.sampled_from(sorted(teams))), draw(st.sampled_from(users))
            if state == "busy":
                gpus.append(GpuState(i, model, memory, 0, 0))
                running.append(RunningJob(run_id, team, user, f"n{n}", (i,), 0.0, 3600.0))
            else:
                used_mem = draw(st.integers(1, memory // 1000)) * 1000
                used_cmp = draw(st.integers(5, 95))
                gpus.append(GpuState(i, model, memory, memory - used_mem, FULL_COMPUTE - used_cmp))
                running.append(
                    RunningJob(
                        run_id,
                        team,
                        user,
                        f"n{n}",
                        (i,),
                        0.0,
                        3600.0,
                        gpus=0,
                        gpu_memory_mb=used_mem,
                        gpu_compute_percent=used_cmp,
                    )
                )
        nodes.append(NodeState(f"n{n}", tuple(gpus), schedulable=draw(st.booleans()) or n == 0))
    pending = []
    for job_id in range(draw(st.integers(0, 18))):
        common = {
            "team": draw(st.sampled_from(sorted(teams))),
            "user": draw(st.sampled_from(users)),
            "submitted_at": float(draw(st.integers(0, 7200))),
            "priority": draw(st.integers(0, 3)),
            "gpu_model": draw(st.sampled_from([None, None, "a100", "h100"])),
            "min_gpu_memory_mb": draw(st.sampled_from([None, None, 80_000])),
        }
        if draw(st.booleans()):
            pending.append(gang(job_id, draw(st.sampled_from([1, 1, 2, 3, 4, 8])), **common))
        else:
            mem = draw(st.integers(1, 40)) * 1000
            pending.append(fraction(job_id, mem, draw(st.integers(5, 100)), **common))
    return Snapshot(
        now=7200.0, nodes=tuple(nodes), running=tuple(running), pending=tuple(pending), teams=teams
    )
