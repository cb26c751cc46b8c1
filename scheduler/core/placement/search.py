"""One-node placement queries of FreeCapacity: best fit (plain or fragmentation-aware),
feasibility of a given spot, candidates and the largest free blocks."""

from __future__ import annotations

from typing import Any

from scheduler.core._capacity_index import (
    _is_whole,
    _KindIndex,
    _lowest_bit,
    _request,
    host_request,
    per_node_gpus,
)
from scheduler.core.fragmentation import (
    PRESSURE_STEP,
    choose_fraction,
    choose_whole,
)
from scheduler.core.model import (
    FULL_COMPUTE,
)
from scheduler.core.placement.state import CapacityState, Choice


class OneNodeSearch(CapacityState):
    def best_fit(self, job: Any) -> Choice | None:
        """The choice leaving the least behind, or None when nothing fits now.

        Gangs go to the node with the fewest wholly free GPUs that still holds them, which
        keeps whole nodes free for large gangs. Fractions go to the partly used GPU with the
        least free compute that still takes them, and only then start a free GPU (on the
        node with the fewest free GPUs). A job asking for host CPUs or memory only goes
        where they fit.

        For one-node jobs; a multi-node gang goes through `best_fit_members`.
        """
        shape = self.shape(job)
        if shape in self._fails:
            return None
        if job.gpus_per_node and job.gpus > job.gpus_per_node:
            raise ValueError(f"job {job.id} spans several nodes: use best_fit_members")
        kinds = self._eligible_kinds(job)
        if self._aware:
            choice = self._least_fragmenting(job, kinds)
        elif self._host and (job.cpus or job.memory_mb):
            host = (job.cpus, job.memory_mb)
            if job.gpus:
                choice = self._best_whole_host(job.gpus, kinds, host)
            else:
                choice = self._best_fraction(job, kinds, host)
        elif job.gpus:
            choice = self._best_gang(job.gpus, kinds)
        else:
            choice = self._best_fraction(job, kinds)
        if choice is None:
            self._fails.add(shape)
        return choice

    def _least_fragmenting(self, job: Any, kinds: list[_KindIndex]) -> Choice | None:
        scorer = self.scorer()
        assert scorer is not None
        host = (job.cpus, job.memory_mb) if self._host and (job.cpus or job.memory_mb) else None
        pressure = self._pressure
        if pressure is None or self._moved > self._moved_limit:
            pressure = self._pressure = scorer.pressure(self._kinds.values())
            total = sum(ki.free for ki in self._kinds.values())
            self._moved, self._moved_limit = 0, int(PRESSURE_STEP * total)
        if job.gpus:
            found = choose_whole(scorer, kinds, self._nodes, job.gpus, host, pressure)
            if found is None:
                return None
            node, kind = found
            return node.name, tuple(node.gpus[p].index for p in node.whole[kind][: job.gpus])
        mem, comp = _request(job)
        spot = choose_fraction(scorer, kinds, self._nodes, comp, mem, host, pressure)
        if spot is None:
            return None
        return spot[0].name, (spot[0].gpus[spot[1]].index,)

    def best_fit_ignoring_host(self, job: Any) -> Choice | None:
        """Where a one-node job would go if host CPUs and memory did not count (for
        explanations; no shape cache)."""
        kinds = self._eligible_kinds(job)
        if job.gpus:
            return self._best_gang(per_node_gpus(job), kinds)
        return self._best_fraction(job, kinds)

    def _best_whole_host(
        self, k: int, kinds: list[_KindIndex], host: tuple[int, int]
    ) -> Choice | None:
        """As _best_gang, skipping nodes without the host CPUs and memory asked for."""
        best: tuple[int, int, _KindIndex] | None = None
        nodes = self._nodes
        for ki in kinds:
            m = ki.bmask >> k
            while m:
                low = m & -m
                count = k + low.bit_length() - 1
                if best is not None and count >= best[0]:
                    break
                hit = next((p for p in ki.buckets[count] if nodes[p].host_fits(*host)), None)
                if hit is not None:
                    best = (count, hit, ki)
                    break
                m ^= low
        if best is None:
            return None
        node, ki = nodes[best[1]], best[2]
        positions = node.whole[(ki.model, ki.memory_mb)][:k]
        return node.name, tuple(node.gpus[p].index for p in positions)

    def _best_gang(self, k: int, kinds: list[_KindIndex]) -> Choice | None:
        best: _KindIndex | None = None
        best_count = 0
        for ki in kinds:
            m = ki.bmask >> k
            if m:
                count = k + _lowest_bit(m)
                if best is None or count < best_count:
                    best, best_count = ki, count
                    if count == k:
                        break
        if best is None:
            return None
        node = self._nodes[next(iter(best.buckets[best_count]))]
        positions = node.whole[(best.model, best.memory_mb)][:k]
        return node.name, tuple(node.gpus[p].index for p in positions)

    def _best_fraction(
        self, job: Any, kinds: list[_KindIndex], host: tuple[int, int] | None = None
    ) -> Choice | None:
        mem, comp = _request(job)
        nodes = self._nodes
        start = max(comp, 1)
        best: tuple[int, int, int] | None = None  # (free compute, node pos, gpu pos)
        for ki in kinds:
            m = ki.pmask >> start
            while m:
                low = m & -m
                value = start + low.bit_length() - 1
                if best is not None and value >= best[0]:
                    break
                hit = None
                for node_pos, p in ki.partial[value]:
                    if nodes[node_pos].mem[p] >= mem and (
                        host is None or nodes[node_pos].host_fits(*host)
                    ):
                        hit = (value, node_pos, p)
                        break
                if hit is not None:
                    best = hit
                    break
                m ^= low
        if best is not None:
            node = nodes[best[1]]
            return node.name, (node.gpus[best[2]].index,)
        if host is not None:
            return self._best_whole_host(1, kinds, host)
        return self._best_gang(1, kinds)

    def best_fit_on(self, job: Any, node: str) -> Choice | None:
        """Best fit restricted to one node (no shape cache: used while GPUs are unheld)."""
        n = self._by_name.get(node)
        if n is None or not n.schedulable or not n.host_fits(*host_request(job)):
            return None
        if job.gpus:
            k = per_node_gpus(job)
            best: list[int] | None = None
            for kind, positions in n.whole.items():
                if len(positions) >= k and self._kind_ok(job, kind[0], kind[1]):
                    if best is None or len(positions) < len(best):
                        best = positions
            if best is None:
                return None
            return n.name, tuple(n.gpus[p].index for p in best[:k])
        mem, comp = _request(job)
        pick: tuple[int, int] | None = None
        for p, gpu in enumerate(n.gpus):
            if not self._kind_ok(job, gpu.model, gpu.memory_mb):
                continue
            if n.comp[p] >= max(comp, 1) and n.mem[p] >= max(mem, 1):
                rank = n.comp[p] + (FULL_COMPUTE if _is_whole(n.mem[p], n.comp[p], gpu) else 0)
                if pick is None or rank < pick[0]:
                    pick = (rank, p)
        return None if pick is None else (n.name, (n.gpus[pick[1]].index,))

    def fits(self, job: Any, node: str, gpu_indices: tuple[int, ...]) -> bool:
        """Whether the job fits on exactly these GPUs now (constraints and free capacity)."""
        n = self._by_name.get(node)
        if n is None or not n.schedulable or not n.host_fits(*host_request(job)):
            return False
        if job.gpus and len(set(gpu_indices)) != per_node_gpus(job):
            return False
        if not job.gpus and len(gpu_indices) != 1:
            return False
        mem, comp = _request(job)
        kinds = set()
        for idx in gpu_indices:
            p = n.index_of.get(idx)
            if p is None:
                return False
            gpu = n.gpus[p]
            if not self._kind_ok(job, gpu.model, gpu.memory_mb):
                return False
            kinds.add(n.kind_of[p])
            if job.gpus:
                if not _is_whole(n.mem[p], n.comp[p], gpu):
                    return False
            elif n.comp[p] < max(comp, 1) or n.mem[p] < max(mem, 1):
                return False
        return len(kinds) == 1

    def candidates(self, job: Any) -> list[Choice]:
        """Every feasible choice, best fit first: one per node for a gang (its lowest free
        GPUs of each kind), one per GPU for a fraction."""
        kinds = self._eligible_kinds(job)
        out: list[tuple[tuple[int, int], Choice]] = []
        host = host_request(job)
        if job.gpus:
            k = per_node_gpus(job)
            for ki in kinds:
                for count in range(k, len(ki.buckets)):
                    for node_pos in ki.buckets[count]:
                        node = self._nodes[node_pos]
                        positions = node.whole[(ki.model, ki.memory_mb)][:k]
                        choice = (node.name, tuple(node.gpus[p].index for p in positions))
                        out.append(((count, node_pos), choice))
        else:
            mem, comp = _request(job)
            for ki in kinds:
                for value in range(max(comp, 1), FULL_COMPUTE + 1):
                    for node_pos, p in ki.partial[value]:
                        node = self._nodes[node_pos]
                        if node.mem[p] >= mem:
                            out.append(((value, node_pos), (node.name, (node.gpus[p].index,))))
                for count in range(1, len(ki.buckets)):
                    for node_pos in ki.buckets[count]:
                        node = self._nodes[node_pos]
                        for p in node.whole[(ki.model, ki.memory_mb)]:
                            rank = (FULL_COMPUTE + count, node_pos)
                            out.append((rank, (node.name, (node.gpus[p].index,))))
        out.sort(key=lambda item: item[0])
        if self._host and (host[0] or host[1]):
            return [c for _, c in out if self._by_name[c[0]].host_fits(*host)]
        return [choice for _, choice in out]

    def largest_free_block(self, model: str | None = None) -> tuple[int, str | None]:
        """Most wholly free GPUs of one kind on one schedulable node, and that node."""
        best, where = 0, None
        for ki in self._kinds.values():
            if model is not None and ki.model != model:
                continue
            if ki.bmask:
                count = ki.bmask.bit_length() - 1
                if count > best:
                    best, where = count, self._nodes[next(iter(ki.buckets[count]))].name
        return best, where

    def largest_free_block_for(self, job: Any) -> tuple[int, str | None]:
        """As largest_free_block, over the GPU kinds this job may use."""
        best, where = 0, None
        for ki in self._eligible_kinds(job):
            if ki.bmask:
                count = ki.bmask.bit_length() - 1
                if count > best:
                    best, where = count, self._nodes[next(iter(ki.buckets[count]))].name
        return best, where

    def most_free_fraction(self, job: Any) -> tuple[int, int, str, int] | None:
        """(free MB, free compute %, node, gpu index) of the roomiest GPU this fraction may
        use: a wholly free one if any, else the partly used one with the most compute."""
        key = self._kinds_key(job)
        cached = self._roomiest.get(key)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        found = self._most_free_fraction(self._eligible_kinds(job))
        self._roomiest[key] = (self.version, found)
        return found

    def _most_free_fraction(self, kinds: list[_KindIndex]) -> tuple[int, int, str, int] | None:
        for ki in kinds:
            if ki.bmask:
                node = self._nodes[next(iter(ki.buckets[ki.bmask.bit_length() - 1]))]
                p = node.whole[(ki.model, ki.memory_mb)][0]
                return node.mem[p], node.comp[p], node.name, node.gpus[p].index
        best: tuple[int, int, str, int] | None = None
        for ki in kinds:
            if ki.pmask:
                value = ki.pmask.bit_length() - 1
                for node_pos, p in ki.partial[value]:
                    node = self._nodes[node_pos]
                    if best is None or (value, node.mem[p]) > (best[1], best[0]):
                        best = (node.mem[p], value, node.name, node.gpus[p].index)
        return best
