"""The fleet's free capacity as the snapshot states it, before any booking: per node its
template, and per GPU kind the buckets of nodes by wholly free GPUs and of partly used GPUs
by free compute. A CapacityState starts from a copy of it.

A driver that carries its (frozen) NodeState objects over between snapshots (the
simulator rebuilds only nodes that changed) gets the base of its last snapshot brought up
to date at the positions that changed, instead of one built from every node; the buckets
keep the order a fresh build gives them (by node position, then GPU), so what a search
finds first is the same."""

from __future__ import annotations

from itertools import compress
from operator import is_not

from scheduler.core._capacity_index import Kind, _KindIndex, _Node
from scheduler.core.model import FULL_COMPUTE, GpuState, NodeState
from scheduler.core.placement.templates import NodeTemplate, node_template

# Changed nodes beyond this share of the fleet: built afresh (an update would cost more).
_UPDATE_SHARE = 0.25


class FleetBase:
    __slots__ = ("states", "templates", "nodes", "by_name", "by_index", "kinds", "host")

    def __init__(self, states: tuple[NodeState, ...]) -> None:
        self.states = states
        self.templates = [node_template(n, pos) for pos, n in enumerate(states)]
        # Per position, the node as a CapacityState starts with it (a template's own node,
        # or a copy where the template was built for another position): never booked on.
        self.nodes = [
            t.node if t.node.pos == pos else _Node.copy_of(t.node, pos)
            for pos, t in enumerate(self.templates)
        ]
        self.by_name = {n.name: n for n in self.nodes}
        self.by_index: dict[str, dict[int, GpuState]] = {
            t.node.name: t.by_index for t in self.templates
        }
        per_node: dict[Kind, int] = {}
        for t in self.templates:
            for kind, count in t.counts.items():
                if count > per_node.get(kind, 0):
                    per_node[kind] = count
        self.kinds = {k: _KindIndex(k[0], k[1], m) for k, m in per_node.items()}
        # Whether some node reports host CPUs or memory (else they limit nothing).
        self.host = any(n.cpus is not None or n.ram is not None for n in self.nodes)
        for node, t in zip(self.nodes, self.templates, strict=True):
            _count(self.kinds, node, t, +1)

    def updated(self, states: tuple[NodeState, ...]) -> FleetBase | None:
        """This base brought up to date for `states` (the same fleet, some nodes changed),
        or None where a fresh one is due: another length, many changes, or a change in
        the GPU kinds, their most per node, names or host reporting."""
        old = self.states
        if len(states) != len(old):
            return None
        changed = list(compress(range(len(states)), map(is_not, old, states)))
        if len(changed) > _UPDATE_SHARE * len(states) + 1:
            return None
        fresh = [node_template(states[pos], pos) for pos in changed]
        kinds = self.kinds
        for pos, t in zip(changed, fresh, strict=True):
            before = self.templates[pos]
            if (
                t.node.name != before.node.name
                or t.node.schedulable != before.node.schedulable
                or t.node.kind_of != before.node.kind_of
                or (t.node.cpus is None) != (before.node.cpus is None)
                or (t.node.ram is None) != (before.node.ram is None)
            ):
                return None
        touched: dict[Kind, tuple[set[int], set[int]]] = {}
        for pos, t in zip(changed, fresh, strict=True):
            node = t.node if t.node.pos == pos else _Node.copy_of(t.node, pos)
            _count(kinds, self.nodes[pos], self.templates[pos], -1, touched)
            _count(kinds, node, t, +1, touched)
            self.templates[pos], self.nodes[pos] = t, node
            self.by_name[node.name] = node
            self.by_index[node.name] = t.by_index
        for kind, (counts, computes) in touched.items():
            ki = kinds[kind]
            for c in counts:
                ki.buckets[c] = dict.fromkeys(sorted(ki.buckets[c]))
            for v in computes:
                ki.partial[v] = dict.fromkeys(sorted(ki.partial[v]))
        self.states = states
        return self

    def working_kinds(self) -> dict[Kind, _KindIndex]:
        """A copy of the per-kind buckets to book on."""
        return {k: _copy(ki) for k, ki in self.kinds.items()}


def _count(
    kinds: dict[Kind, _KindIndex],
    node: _Node,
    t: NodeTemplate,
    sign: int,
    touched: dict[Kind, tuple[set[int], set[int]]] | None = None,
) -> None:
    """Add (sign +1) or take out (-1) a node's free capacity in the kinds' buckets; note
    in `touched` the buckets whose order an update must restore."""
    for kind, comp, p in t.partial:
        ki = kinds[kind]
        if sign > 0:
            ki.partial_add(comp, (node.pos, p))
        else:
            ki.partial_remove(comp, (node.pos, p))
        ki.free += sign * comp
        if touched is not None:
            touched.setdefault(kind, (set(), set()))[1].add(comp)
    for kind, positions in node.whole.items():
        ki = kinds[kind]
        if sign > 0:
            ki.bucket_add(len(positions), node.pos)
        else:
            ki.bucket_remove(len(positions), node.pos)
        ki.whole_total += sign * len(positions)
        ki.free += sign * FULL_COMPUTE * len(positions)
        if touched is not None and positions:
            touched.setdefault(kind, (set(), set()))[0].add(len(positions))


def _copy(ki: _KindIndex) -> _KindIndex:
    new = _KindIndex.__new__(_KindIndex)
    new.model, new.memory_mb = ki.model, ki.memory_mb
    new.buckets = [b.copy() for b in ki.buckets]
    new.bmask = ki.bmask
    new.partial = [b.copy() if b else {} for b in ki.partial]
    new.pmask = ki.pmask
    new.whole_total = ki.whole_total
    new.free = ki.free
    return new


_BASE: list[FleetBase] = []


def fleet_base(states: tuple[NodeState, ...]) -> FleetBase:
    """The base for these nodes: the last one, updated where it can be, else a new one."""
    last = _BASE[0] if _BASE else None
    if last is not None:
        if last.states is states:
            return last
        found = last.updated(states)
        if found is not None:
            return found
    found = FleetBase(states)
    _BASE[:] = [found]
    return found
