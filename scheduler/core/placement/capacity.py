"""FreeCapacity: the fleet's free capacity as a mutable working copy (see the package
docstring); bookings that take and give back capacity and keep the indexes in step."""

from __future__ import annotations

from bisect import insort
from typing import Any

from scheduler.core._capacity_index import (
    _is_partial,
    _is_whole,
    _Node,
    _request,
    _usable,
)
from scheduler.core.fragmentation import (
    demand_of_snapshot,
)
from scheduler.core.model import (
    FULL_COMPUTE,
    Snapshot,
)
from scheduler.core.placement.gangs import GangSearch
from scheduler.core.placement.state import Members


class FreeCapacity(GangSearch):
    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> FreeCapacity:
        """Fragmentation-aware for the snapshot's demand, unless settings "placement" is
        "best_fit"."""
        if snapshot.settings.get("placement", "fragmentation") == "best_fit":
            return cls(snapshot.nodes)
        return cls(snapshot.nodes, demand_source=lambda: demand_of_snapshot(snapshot))

    # -- bookings ------------------------------------------------------------------------

    def take(self, job: Any, node: str, gpu_indices: tuple[int, ...]) -> None:
        """Book the job's share of these GPUs (the caller has checked that it fits)."""
        n = self._own(node)
        mem, comp = _request(job)
        for idx in gpu_indices:
            p = n.index_of[idx]
            if job.gpus:
                self._set(n, p, 0, 0)
            else:
                self._set(n, p, max(0, n.mem[p] - mem), max(0, n.comp[p] - comp))
        cpus, ram = job.cpus, job.memory_mb
        if cpus or ram:
            n.host_add(-cpus, -ram)
            self.version += 1

    def take_members(self, job: Any, members: Members) -> None:
        """Book every member of a placement (the caller has checked that it fits)."""
        for m in members:
            self.take(job, m.node, m.gpu_indices)

    def release_members(self, job: Any, members: Members) -> None:
        """Give back every member of a placement."""
        for m in members:
            self.release(job, m.node, m.gpu_indices)

    def release(self, job: Any, node: str, gpu_indices: tuple[int, ...]) -> None:
        """Give back what the job held on these GPUs (a running job ending, a booking undone)."""
        n = self._own(node)
        mem, comp = _request(job)
        for idx in gpu_indices:
            p = n.index_of[idx]
            gpu = n.gpus[p]
            if job.gpus:
                self._set(n, p, gpu.memory_mb, FULL_COMPUTE)
            else:
                self._set(
                    n, p, min(gpu.memory_mb, n.mem[p] + mem), min(FULL_COMPUTE, n.comp[p] + comp)
                )
        cpus, ram = job.cpus, job.memory_mb
        if cpus or ram:
            n.host_add(cpus, ram)
            self.version += 1
        self._fails.clear()

    def hold(self, node: str, gpu_index: int) -> tuple[int, int]:
        """Book everything still free on a GPU (to keep it for a reservation or for a job
        waiting on preemptions); returns the amount held, for `unhold`."""
        n = self._own(node)
        p = n.index_of[gpu_index]
        amount = (n.mem[p], n.comp[p])
        self._set(n, p, 0, 0)
        return amount

    def unhold(self, node: str, gpu_index: int, amount: tuple[int, int]) -> None:
        """Give back a hold. Remembered failures stay, so the caller must hold again (or
        book more) before relying on best_fit; best_fit_on ignores them."""
        n = self._own(node)
        p = n.index_of[gpu_index]
        gpu = n.gpus[p]
        mem = min(gpu.memory_mb, n.mem[p] + amount[0])
        self._set(n, p, mem, min(FULL_COMPUTE, n.comp[p] + amount[1]))

    def hold_host(self, node: str, cpus: int, memory_mb: int) -> tuple[int, int]:
        """Book up to these host CPUs and memory on a node (what is free of them); returns
        the amount held, for `unhold_host`."""
        n = self._own(node)
        held = (
            0 if n.cpus is None else min(n.cpus, cpus),
            0 if n.ram is None else min(n.ram, memory_mb),
        )
        if held[0] or held[1]:
            n.host_add(-held[0], -held[1])
            self.version += 1
        return held

    def unhold_host(self, node: str, amount: tuple[int, int]) -> None:
        """Give back a host hold (remembered failures stay, as with `unhold`)."""
        if amount[0] or amount[1]:
            self._own(node).host_add(amount[0], amount[1])
            self.version += 1

    def _set(self, n: _Node, p: int, mem: int, comp: int) -> None:
        gpu = n.gpus[p]
        old_mem, old_comp = n.mem[p], n.comp[p]
        n.mem[p], n.comp[p] = mem, comp
        self.version += 1
        n.version += 1
        if not n.schedulable:
            return
        kind = n.kind_of[p]
        ki = self._kinds[kind]
        moved = _usable(mem, comp) - _usable(old_mem, old_comp)
        ki.free += moved
        self._moved += abs(moved)
        was_whole, now_whole = _is_whole(old_mem, old_comp, gpu), _is_whole(mem, comp, gpu)
        if was_whole != now_whole:
            positions = n.whole.setdefault(kind, [])
            ki.bucket_remove(len(positions), n.pos)
            if was_whole:
                positions.remove(p)
                ki.whole_total -= 1
            else:
                insort(positions, p)
                ki.whole_total += 1
            ki.bucket_add(len(positions), n.pos)
        key = (n.pos, p)
        if _is_partial(old_mem, old_comp, gpu):
            ki.partial_remove(old_comp, key)
        if _is_partial(mem, comp, gpu):
            ki.partial_add(comp, key)
