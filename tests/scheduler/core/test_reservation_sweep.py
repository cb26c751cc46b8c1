"""The gang sweep of the reservation search gives what the per-GPU occupant lists gave,
and the multi-node sweep gives the first release time at which enough nodes each hold a
member (checked by brute force over every release time)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.model import FULL_COMPUTE, Snapshot
from scheduler.core.placement import FreeCapacity
from scheduler.core.reservation import (
    Occupant,
    earliest_start,
    earliest_start_members,
    occupant_of,
    occupants_of,
    running_occupants,
)
from tests.scheduler.policies.strategies import snapshots


def _reference(
    job: Any, cap: FreeCapacity, occupants: list[Occupant], now: float
) -> tuple[str, float, tuple[int, ...]] | None:
    on_gpu: dict[tuple[str, int], list[Occupant]] = {}
    for occ in occupants:
        for idx in occ.gpu_indices:
            on_gpu.setdefault((occ.node, idx), []).append(occ)
    return _gang_sweep(job, cap, on_gpu, now)


def _gang_sweep(
    job: Any, cap: FreeCapacity, on_gpu: dict[tuple[str, int], list[Occupant]], now: float
) -> tuple[str, float, tuple[int, ...]] | None:
    """Walk GPU release times in order, counting wholly free GPUs per node and kind, until
    some node holds the gang: O(busy GPUs log busy GPUs), not a pass per node."""
    kind_ok: dict[tuple[str, int], bool] = {}

    def eligible(node: str, gpu: Any) -> bool:
        key = (gpu.model, gpu.memory_mb)
        ok = kind_ok.get(key)
        if ok is None:
            ok = kind_ok[key] = cap.eligible(job, node, gpu)
        return ok

    ready: dict[tuple[str, str, int], list[int]] = {}
    for node in cap.node_names():
        free_now = cap.whole_free(node) if cap.is_schedulable(node) else ()
        if not free_now:
            continue
        for gpu in cap.node_gpus(node):
            if gpu.index in free_now and eligible(node, gpu):
                ready.setdefault((node, gpu.model, gpu.memory_mb), []).append(gpu.index)
    for key, indices in ready.items():
        if len(indices) >= job.gpus:
            return key[0], now, tuple(indices[: job.gpus])
    releases = []
    gpus_of: dict[str, dict[int, Any]] = {}
    for (node, idx), occs in on_gpu.items():
        gpus = gpus_of.get(node)
        if gpus is None:
            ok = cap.is_schedulable(node)
            gpus = gpus_of[node] = {g.index: g for g in cap.node_gpus(node)} if ok else {}
        held = gpus.get(idx)
        if held is None or not eligible(node, held):
            continue
        mem, comp = cap.free_on(node, idx)
        end = now
        for occ in occs:
            if occ.gpus:
                mem, comp = held.memory_mb, FULL_COMPUTE
            else:
                mem += occ.gpu_memory_mb or 0
                comp += occ.gpu_compute_percent or 0
            end = max(end, occ.end)
        if comp >= FULL_COMPUTE and mem >= held.memory_mb:
            releases.append((end, node, idx, held.model, held.memory_mb))
    releases.sort()
    for when, node, idx, model, memory_mb in releases:
        indices = ready.setdefault((node, model, memory_mb), [])
        indices.append(idx)
        if len(indices) >= job.gpus:
            return node, when, tuple(sorted(indices[: job.gpus]))
    return None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=snapshots(max_nodes=4, max_pending=20), booked=st.integers(0, 6))
def test_gang_sweep_matches_the_occupant_lists(snapshot: Snapshot, booked: int) -> None:
    cap = FreeCapacity.from_snapshot(snapshot)
    occupants = running_occupants(snapshot.running, use_predictions=False)
    # One-node jobs without host needs (the plain sweep's case).
    gangs = [replace(j, gpus_per_node=0, cpus=0, memory_mb=0) for j in snapshot.pending if j.gpus]
    for job in snapshot.pending[:booked]:  # placements earlier in the same cycle
        choice = cap.best_fit_members(job)
        if choice is not None:
            cap.take_members(job, choice)
            occupants.extend(occupants_of(job, choice, snapshot.now + job.time_limit))
    for job in gangs:
        expected = _reference(job, cap, occupants, snapshot.now)
        assert earliest_start(job, cap, occupants, snapshot.now) == expected
        # The multi-node sweep, for one member, finds the same time.
        spread = earliest_start_members(job, cap, occupants, snapshot.now)
        assert (spread and spread[0]) == (expected and expected[1])


def _brute_start(job: Any, cap: FreeCapacity, occupants: list[Occupant], now: float):
    """The first of now and every occupant end at which enough nodes hold a member."""
    per, need = job.gpus_on_each_node, job.nodes
    for t in sorted({now, *(max(now, o.end) for o in occupants)}):
        holders: dict[tuple[str, int], list[str]] = {}
        for node in cap.node_names():
            if not cap.is_schedulable(node):
                continue
            cpus, ram = cap.host_free(node)
            back = [o for o in occupants if o.node == node and max(now, o.end) <= t]
            if cpus is not None and cpus + sum(o.cpus for o in back) < job.cpus:
                continue
            if ram is not None and ram + sum(o.memory_mb for o in back) < job.memory_mb:
                continue
            free: dict[tuple[str, int], int] = {}
            for gpu in cap.node_gpus(node):
                if not cap.eligible(job, node, gpu):
                    continue
                on = [o for o in occupants if o.node == node and gpu.index in o.gpu_indices]
                mem, comp = cap.free_on(node, gpu.index)
                done = all(max(now, o.end) <= t for o in on)
                if on and done:
                    if any(o.gpus for o in on):
                        mem, comp = gpu.memory_mb, FULL_COMPUTE
                    else:
                        mem += sum(o.gpu_memory_mb or 0 for o in on)
                        comp += sum(o.gpu_compute_percent or 0 for o in on)
                if (not on or done) and comp >= FULL_COMPUTE and mem >= gpu.memory_mb:
                    key = (gpu.model, gpu.memory_mb)
                    free[key] = free.get(key, 0) + 1
            for key, count in free.items():
                if count >= per:
                    holders.setdefault(key, []).append(node)
        for nodes in holders.values():
            groups: dict[str, int] = {}
            for node in nodes:
                group = cap.group_of(node)
                if group:
                    groups[group] = groups.get(group, 0) + 1
            grouped = job.same_group and need > 1
            most = max(groups.values(), default=0) if grouped else len(nodes)
            if most >= need:
                return t
    return None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=snapshots(max_nodes=4, max_pending=20), booked=st.integers(0, 6))
def test_multi_node_sweep_matches_brute_force(snapshot: Snapshot, booked: int) -> None:
    cap = FreeCapacity.from_snapshot(snapshot)
    occupants = running_occupants(snapshot.running, use_predictions=False)
    for job in snapshot.pending[:booked]:
        choice = cap.best_fit_members(job)
        if choice is not None:
            cap.take_members(job, choice)
            occupants.extend(occupants_of(job, choice, snapshot.now + job.time_limit))
    for job in snapshot.pending:
        if not job.gpus:
            continue
        found = earliest_start_members(job, cap, occupants, snapshot.now)
        assert (found and found[0]) == _brute_start(job, cap, occupants, snapshot.now)
        if found is not None:
            start, members = found
            assert len(members) == job.nodes
            assert len({m.node for m in members}) == job.nodes
            assert all(len(m.gpu_indices) == job.gpus_on_each_node for m in members)


@settings(max_examples=30, deadline=None)
@given(snapshot=snapshots(max_nodes=4, max_pending=2), predictions=st.booleans())
def test_running_occupants_reused_across_cycles_match_fresh_ones(
    snapshot: Snapshot, predictions: bool
) -> None:
    def fresh(running: tuple) -> list[Occupant]:
        return [
            occupant_of(r, m.node, m.gpu_indices, r.expected_end if predictions else r.limit_end)
            for r in running
            for m in r.allocations
        ]

    first = running_occupants(snapshot.running, use_predictions=predictions)
    again = running_occupants(snapshot.running, use_predictions=predictions)
    assert first == again == fresh(snapshot.running)
    later = tuple(replace(r, started_at=r.started_at + 100.0) for r in snapshot.running)
    assert running_occupants(later, use_predictions=predictions) == fresh(later)
