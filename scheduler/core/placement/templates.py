"""Per-node templates kept across snapshots: what FreeCapacity derives from one (frozen)
NodeState, built once while that object is reused (the simulator rebuilds only nodes that
changed)."""

from __future__ import annotations

from scheduler.core._capacity_index import Kind, _is_partial, _is_whole, _Node
from scheduler.core.model import GpuState, NodeState


class NodeTemplate:
    """What FreeCapacity derives from one NodeState, kept while that (frozen) object is
    reused by the next snapshot (the simulator rebuilds only nodes that changed). Its node
    is never booked on: a FreeCapacity shares it until its first booking there (and at
    another position than the one it was built for, copies it at once)."""

    __slots__ = ("state", "node", "counts", "partial", "by_index")

    def __init__(self, state: NodeState, pos: int) -> None:
        self.state = state  # keeps the id the cache is keyed on alive
        node = self.node = _Node(state, pos)
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


_TEMPLATES: dict[int, NodeTemplate] = {}
_TEMPLATES_MAX = 1 << 14


def node_template(state: NodeState, pos: int) -> NodeTemplate:
    found = _TEMPLATES.get(id(state))
    if found is not None and found.state is state:
        return found
    if len(_TEMPLATES) >= _TEMPLATES_MAX:
        _TEMPLATES.clear()
    found = _TEMPLATES[id(state)] = NodeTemplate(state, pos)
    return found
