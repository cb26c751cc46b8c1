"""Free capacity of the fleet as a mutable working copy, shared by every policy.

`from_snapshot` places fragmentation-aware by default (scheduler.core.fragmentation,
docs/packing.md): `best_fit` and `best_fit_members` then choose the spot that leaves the
most of the recent request mix able to fit; settings "placement" "best_fit" gives the
plain best fit described below.

`FreeCapacity.from_snapshot(snapshot)` copies what running jobs leave free on each GPU of
each schedulable node; a policy then asks where a job fits (`best_fit`, `candidates`) and
books its choices (`take`), or gives capacity back (`release`) when it simulates jobs
ending. Draining and down nodes are kept, so that releases on them are accounted, but
never offered.

Indexes keep a cycle cheap on large fleets:

- GPUs are grouped by kind, `(model, memory_mb)`. A gang takes GPUs of one kind on one
  node (mixing models inside a data-parallel job makes it run at the slowest GPU's pace).
- Per kind, nodes sit in buckets by their count of wholly free GPUs, with a bit mask of
  non-empty buckets, so "the node with the fewest free GPUs that still holds k" is a
  couple of integer operations.
- Per kind, partly used GPUs sit in buckets by free compute percent (also with a mask),
  so a fraction first looks at the fullest GPUs that still take it.
- A request shape that found nothing is remembered until some capacity is released:
  in a cycle capacity only shrinks, so a second job of the same shape is skipped at once.

Host CPUs and memory are capacity too: a job's `cpus` and `memory_mb` (per node) must fit
what the node has free, and `take`/`release` book them. Nodes that do not report them are
not limited; jobs that ask for none, or a fleet where no node reports them, keep the plain
GPU paths above.

A multi-node gang (`gpus_per_node`) goes through `best_fit_members`, `fits_members`,
`take_members` and `release_members`: every member on its own node, all GPUs of one kind,
placed all at once or not at all. Its nodes come from as few topology groups as possible
(one when the job says `same_group`), then from the nodes with the fewest free GPUs that
still hold a member, which keeps whole nodes for bigger gangs.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable
from typing import Any

from scheduler.core._capacity_index import (
    Kind,
    _is_partial,
    _is_whole,
    _KindIndex,
    _lowest_bit,
    _Node,
    _request,
    _usable,
    host_request,
    node_count,
    per_node_gpus,
)
from scheduler.core.fragmentation import (
    PRESSURE_STEP,
    Demand,
    Scorer,
    choose_fraction,
    choose_whole,
    demand_of_snapshot,
)
from scheduler.core.model import (
    FULL_COMPUTE,
    GpuState,
    Member,
    NodeState,
    Snapshot,
    is_mig_device,
)

Choice = tuple[str, tuple[int, ...]]
Members = tuple[Member, ...]


class _Template:
    """What FreeCapacity derives from one NodeState, kept while that (frozen) object is
    reused by the next snapshot (the simulator rebuilds only nodes that changed)."""

    __slots__ = ("state", "node", "counts", "partial", "by_index")

    def __init__(self, state: NodeState) -> None:
        self.state = state  # keeps the id the cache is keyed on alive
        node = self.node = _Node(state, 0)
        self.counts: dict[Kind, int] = {}
        for kind in node.kind_of:
            self.counts[kind] = self.counts.get(kind, 0) + 1
        self.partial: list[tuple[Kind, int, int]] = []
        # GPU by index on a schedulable node (empty otherwise): read-only, shared.
        self.by_index: dict[int, GpuState] = (
            {g.index: g for g in node.gpus} if node.schedulable else {}
        )
        if node.schedulable:
            for p, gpu in enumerate(node.gpus):
                kind, mem, comp = node.kind_of[p], node.mem[p], node.comp[p]
                if _is_whole(mem, comp, gpu):
                    node.whole.setdefault(kind, []).append(p)
                elif _is_partial(mem, comp, gpu):
                    self.partial.append((kind, comp, p))


_TEMPLATES: dict[int, _Template] = {}
_TEMPLATES_MAX = 1 << 14


def _template(state: NodeState) -> _Template:
    found = _TEMPLATES.get(id(state))
    if found is not None and found.state is state:
        return found
    if len(_TEMPLATES) >= _TEMPLATES_MAX:
        _TEMPLATES.clear()
    found = _TEMPLATES[id(state)] = _Template(state)
    return found


class FreeCapacity:
    def __init__(
        self,
        nodes: tuple[NodeState, ...],
        demand: Demand | None = None,
        demand_source: Callable[[], Demand] | None = None,
    ) -> None:
        # With a demand (or a source of one, read on the first placement that needs it),
        # one-node jobs and gang members go where they fragment the fleet least for that
        # demand (scheduler.core.fragmentation); without, plain best fit.
        self._aware = demand is not None or demand_source is not None
        self._scorer = None if demand is None else Scorer(demand)
        self._demand_source = demand_source
        # The scorer's per-kind pressure, and free capacity booked or freed since.
        self._pressure: dict[Kind, float] | None = None
        self._moved = 0
        self._moved_limit = 0
        templates = [_template(n) for n in nodes]
        self._by_index = {t.node.name: t.by_index for t in templates}
        self._nodes = [_Node.copy_of(t.node, pos) for pos, t in enumerate(templates)]
        self._by_name = {n.name: n for n in self._nodes}
        per_node: dict[Kind, int] = {}
        for t in templates:
            for kind, count in t.counts.items():
                if count > per_node.get(kind, 0):
                    per_node[kind] = count
        self._kinds = {k: _KindIndex(k[0], k[1], m) for k, m in per_node.items()}
        self._eligible_cache: dict[tuple[str | None, int, bool], list[_KindIndex]] = {}
        self._fails: set[tuple[Any, ...]] = set()
        self._roomiest: dict[tuple[Any, ...], tuple[int, Any]] = {}
        self.version = 0
        # Whether some node reports host CPUs or memory (else they limit nothing).
        self._host = any(n.cpus is not None or n.ram is not None for n in self._nodes)
        kinds = self._kinds
        for node, t in zip(self._nodes, templates, strict=True):
            for kind, comp, p in t.partial:
                kinds[kind].partial_add(comp, (node.pos, p))
                kinds[kind].free += comp
            for kind, positions in node.whole.items():
                ki = kinds[kind]
                ki.bucket_add(len(positions), node.pos)
                ki.whole_total += len(positions)
                ki.free += FULL_COMPUTE * len(positions)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> FreeCapacity:
        """Fragmentation-aware for the snapshot's demand, unless settings "placement" is
        "best_fit"."""
        if snapshot.settings.get("placement", "fragmentation") == "best_fit":
            return cls(snapshot.nodes)
        return cls(snapshot.nodes, demand_source=lambda: demand_of_snapshot(snapshot))

    @property
    def fragmentation_aware(self) -> bool:
        return self._aware

    def scorer(self) -> Scorer | None:
        """The fragmentation scorer (built from the demand source on first use), or None
        for plain best fit."""
        if self._scorer is None and self._demand_source is not None:
            self._scorer = Scorer(self._demand_source())
            self._demand_source = None
        return self._scorer

    # -- constraints -------------------------------------------------------------------

    def eligible(self, job: Any, node: str | NodeState, gpu: int | GpuState) -> bool:
        """Whether the GPU's model and memory suit the job, whatever is free on it now."""
        if not isinstance(gpu, GpuState):
            name = node if isinstance(node, str) else node.name
            n = self._by_name[name]
            gpu = n.gpus[n.index_of[gpu]]
        return self._kind_ok(job, gpu.model, gpu.memory_mb)

    @staticmethod
    def _kind_ok(job: Any, model: str, memory_mb: int) -> bool:
        if job.gpu_model is not None and job.gpu_model != model:
            return False
        if _several_per_node(job) and is_mig_device(model):
            return False
        if job.min_gpu_memory_mb is not None and memory_mb < job.min_gpu_memory_mb:
            return False
        if job.gpus == 0 and memory_mb < (job.gpu_memory_mb or 0):
            return False
        return True

    @staticmethod
    def _kinds_key(job: Any) -> tuple[str | None, int, bool]:
        """What decides which GPU kinds a job may use: its model and memory needs, and
        whether it needs several GPUs on one node (no MIG devices then)."""
        need = max(job.min_gpu_memory_mb or 0, 0 if job.gpus else job.gpu_memory_mb or 0)
        return (job.gpu_model, need, _several_per_node(job))

    def _eligible_kinds(self, job: Any) -> list[_KindIndex]:
        key = self._kinds_key(job)
        need, several = key[1], key[2]
        kinds = self._eligible_cache.get(key)
        if kinds is None:
            kinds = [
                ki
                for ki in self._kinds.values()
                if (job.gpu_model is None or ki.model == job.gpu_model)
                and ki.memory_mb >= need
                and not (several and is_mig_device(ki.model))
            ]
            self._eligible_cache[key] = kinds
        return kinds

    @staticmethod
    def shape(job: Any) -> tuple[Any, ...]:
        """What decides where a job may go: its GPU count or fraction, how it spreads over
        nodes, its host CPUs and memory, and its constraints."""
        if job.gpus:
            return (
                job.gpus,
                job.gpu_model,
                job.min_gpu_memory_mb,
                job.gpus_per_node,
                job.cpus,
                job.memory_mb,
                job.same_group,
            )
        return (
            0,
            job.gpu_model,
            job.min_gpu_memory_mb,
            job.gpu_memory_mb,
            job.gpu_compute_percent,
            job.cpus,
            job.memory_mb,
        )

    # -- queries -------------------------------------------------------------------------

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

    def best_fit_members(self, job: Any) -> Members | None:
        """Every member of the job's best placement, rank 0 first, or None when it does not
        fit now: one member for a one-node job (as `best_fit`); for a multi-node gang a
        distinct node per member, all of them or none."""
        if not (job.gpus_per_node and job.gpus > job.gpus_per_node):
            choice = self.best_fit(job)
            return None if choice is None else (Member(choice[0], choice[1]),)
        shape = self.shape(job)
        if shape in self._fails:
            return None
        found = self._best_spread(job, self._eligible_kinds(job))
        if found is None:
            self._fails.add(shape)
        return found

    def _spread_candidates(
        self, ki: _KindIndex, per: int, host: tuple[int, int]
    ) -> dict[str, list[tuple[int, int]]]:
        """Per topology group, (free count, node position) of the nodes that hold a member
        (`per` wholly free GPUs of this kind and the host share), tightest first."""
        by_group: dict[str, list[tuple[int, int]]] = {}
        nodes = self._nodes
        check = self._host and (host[0] or host[1])
        for count in range(per, len(ki.buckets)):
            if not (ki.bmask >> count) & 1:
                continue
            for pos in ki.buckets[count]:
                node = nodes[pos]
                if check and not node.host_fits(*host):
                    continue
                by_group.setdefault(node.group, []).append((count, pos))
        return by_group

    def _best_spread(self, job: Any, kinds: list[_KindIndex]) -> Members | None:
        """Per GPU kind, nodes are scanned from the fewest free GPUs up (fragmentation-aware:
        from the free count where a member raises fragmentation least up); the first count
        at which one group holds every member settles that kind (the group whose members
        leave the fewest GPUs behind, or raise fragmentation least), so a busy fleet is not
        scanned whole. Only when no group can hold them all are the members spread over the
        fewest groups."""
        need, per = node_count(job), per_node_gpus(job)
        host = host_request(job)
        check = self._host and (host[0] or host[1])
        same_group = bool(job.same_group)
        nodes = self._nodes
        scorer = self.scorer()
        best: tuple[tuple[Any, ...], _KindIndex, list[tuple[int, int]]] | None = None
        for ki in kinds:
            if ki.whole_total < need * per:
                continue
            kind = (ki.model, ki.memory_mb)
            level: dict[int, float] = {}
            counts_order: list[int] = list(range(per, len(ki.buckets)))
            if scorer is not None:
                level = {c: scorer.whole(kind, c, per) for c in counts_order}
                counts_order.sort(key=lambda c: (level[c], c))
            else:
                level = {c: float(c) for c in counts_order}
            by_group: dict[str, list[tuple[int, int]]] = {}
            found: tuple[tuple[Any, ...], list[tuple[int, int]]] | None = None
            for count in counts_order:
                if best is not None and best[0][0] == 1 and level[count] > best[0][1]:
                    break
                if not (ki.bmask >> count) & 1:
                    continue
                for pos in ki.buckets[count]:
                    if check and not nodes[pos].host_fits(*host):
                        continue
                    by_group.setdefault(nodes[pos].group, []).append((count, pos))
                complete = [
                    (sum(level[c] for c, _ in cands[:need]), group)
                    for group, cands in by_group.items()
                    if len(cands) >= need and (group or not same_group)
                ]
                if complete:
                    total, group = min(complete)
                    found = ((1, level[count], total), by_group[group][:need])
                    break
            if found is None and not same_group:
                picked = spread(by_group, need, False)
                if picked is not None:
                    groups, chosen = picked
                    levels = [level[c] for c, _ in chosen]
                    found = ((groups, max(levels), sum(levels)), chosen)
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], ki, found[1])
        if best is None:
            return None
        _, ki, chosen = best
        kind = (ki.model, ki.memory_mb)
        out = []
        for _, pos in chosen:
            node = nodes[pos]
            out.append(Member(node.name, tuple(node.gpus[p].index for p in node.whole[kind][:per])))
        return tuple(out)

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

    def fits_members(self, job: Any, members: Members) -> bool:
        """Whether the job fits on exactly these members now: one per node it spans, each
        on its own node, every GPU of one kind, in one group when it says same_group."""
        if len(members) != node_count(job) or len({m.node for m in members}) != len(members):
            return False
        kinds: set[Kind] = set()
        groups = set()
        for m in members:
            if not self.fits(job, m.node, m.gpu_indices):
                return False
            n = self._by_name[m.node]
            kinds.update(n.kind_of[n.index_of[i]] for i in m.gpu_indices)
            groups.add(n.group)
        if getattr(job, "same_group", False) and len(members) > 1:
            if len(groups) != 1 or "" in groups:
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

    def member_room(self, job: Any) -> tuple[int, int, int]:
        """For a multi-node gang, over the GPU kind with the most: nodes with a member's
        GPUs wholly free, those of them with its host CPUs and memory too, and the most
        of the latter in one topology group (for explanations)."""
        per, host = per_node_gpus(job), host_request(job)
        best = (0, 0, 0)
        for ki in self._eligible_kinds(job):
            ready = sum(len(ki.buckets[c]) for c in range(per, len(ki.buckets)))
            by_group = self._spread_candidates(ki, per, host)
            with_host = sum(len(c) for c in by_group.values())
            in_group = max((len(c) for g, c in by_group.items() if g), default=0)
            best = max(best, (ready, with_host, in_group))
        return best

    def shapes_that_fit(self, jobs: Any) -> set[tuple[Any, ...]]:
        """Request shapes among `jobs` that fit somewhere now (one best_fit per shape)."""
        seen: dict[tuple[Any, ...], Any] = {}
        for job in jobs:
            seen.setdefault(self.shape(job), job)
        return {shape for shape, job in seen.items() if self.best_fit_members(job) is not None}

    def has_partial(self) -> bool:
        """Whether some schedulable GPU is partly used and still has room."""
        return any(ki.pmask for ki in self._kinds.values())

    def node_version(self, node: str) -> int:
        """A counter that changes whenever the node's free capacity changes."""
        return self._by_name[node].version

    def free_gpus_total(self) -> int:
        """Wholly free GPUs on schedulable nodes."""
        return sum(ki.whole_total for ki in self._kinds.values())

    def free_on(self, node: str, gpu_index: int) -> tuple[int, int]:
        """(free MB, free compute %) of one GPU."""
        n = self._by_name[node]
        p = n.index_of[gpu_index]
        return n.mem[p], n.comp[p]

    def whole_free(self, node: str) -> tuple[int, ...]:
        """Indices of the wholly free GPUs on a node (empty if it is not schedulable)."""
        n = self._by_name[node]
        return tuple(sorted(n.gpus[p].index for ps in n.whole.values() for p in ps))

    def nodes_with_whole_free(self, k: int) -> list[str]:
        """Schedulable nodes with at least k wholly free GPUs of one kind, in fleet order
        (from the per-kind buckets: what changed, not a pass over the fleet)."""
        positions: set[int] = set()
        for ki in self._kinds.values():
            for count in range(max(k, 1), len(ki.buckets)):
                if (ki.bmask >> count) & 1:
                    positions.update(ki.buckets[count])
        return [self._nodes[p].name for p in sorted(positions)]

    def node_names(self) -> list[str]:
        return [n.name for n in self._nodes]

    def node_gpus(self, node: str) -> tuple[GpuState, ...]:
        return self._by_name[node].gpus

    def gpus_by_index(self, node: str) -> dict[int, GpuState]:
        """The node's GPUs by index; empty for an unknown or unschedulable node. Read-only."""
        return self._by_index.get(node, {})

    def is_schedulable(self, node: str) -> bool:
        n = self._by_name.get(node)
        return n is not None and n.schedulable

    # -- bookings ------------------------------------------------------------------------

    def take(self, job: Any, node: str, gpu_indices: tuple[int, ...]) -> None:
        """Book the job's share of these GPUs (the caller has checked that it fits)."""
        n = self._by_name[node]
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
        n = self._by_name[node]
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
        n = self._by_name[node]
        p = n.index_of[gpu_index]
        amount = (n.mem[p], n.comp[p])
        self._set(n, p, 0, 0)
        return amount

    def unhold(self, node: str, gpu_index: int, amount: tuple[int, int]) -> None:
        """Give back a hold. Remembered failures stay, so the caller must hold again (or
        book more) before relying on best_fit; best_fit_on ignores them."""
        n = self._by_name[node]
        p = n.index_of[gpu_index]
        gpu = n.gpus[p]
        mem = min(gpu.memory_mb, n.mem[p] + amount[0])
        self._set(n, p, mem, min(FULL_COMPUTE, n.comp[p] + amount[1]))

    def hold_host(self, node: str, cpus: int, memory_mb: int) -> tuple[int, int]:
        """Book up to these host CPUs and memory on a node (what is free of them); returns
        the amount held, for `unhold_host`."""
        n = self._by_name[node]
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
            self._by_name[node].host_add(amount[0], amount[1])
            self.version += 1

    def host_free(self, node: str) -> tuple[int | None, int | None]:
        """(free CPU cores, free memory MB) of a node; None where it does not report them."""
        n = self._by_name[node]
        return n.cpus, n.ram

    def host_limited(self) -> bool:
        """Whether some node reports host CPUs or memory."""
        return self._host

    def group_of(self, node: str) -> str:
        return self._by_name[node].group

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


def spread(
    by_group: dict[str, list[tuple[int, int]]], need: int, same_group: bool
) -> tuple[int, list[tuple[int, int]]] | None:
    """Pick `need` nodes from per-group candidates ((free count, position), tightest first):
    (groups used, picks), or None. One group when some group holds them all (the one whose
    picks leave the fewest GPUs behind); else, unless `same_group`, the biggest groups first,
    which uses the fewest groups, taking the tightest nodes of the last one. Nodes without
    a group ("") never satisfy `same_group`; one member needs no group."""
    same_group = same_group and need > 1
    whole = [
        (sum(c for c, _ in cands[:need]), group)
        for group, cands in by_group.items()
        if len(cands) >= need and (group or not same_group)
    ]
    if whole:
        _, group = min(whole)
        return 1, by_group[group][:need]
    if same_group:
        return None
    if sum(len(c) for c in by_group.values()) < need:
        return None
    picks: list[tuple[int, int]] = []
    groups = 0
    for group in sorted(by_group, key=lambda g: (-len(by_group[g]), g)):
        groups += 1
        picks.extend(by_group[group][: need - len(picks)])
        if len(picks) >= need:
            break
    return groups, picks


def _several_per_node(job: Any) -> bool:
    """Whether the job needs more than one GPU on some node."""
    return per_node_gpus(job) > 1
