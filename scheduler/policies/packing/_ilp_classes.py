"""Classes of identical capacity for the ILP (`_ilp_model`): slots of wholly free GPUs
grouped by kind, count and idle node; partly used GPUs grouped by kind and free room; job
classes by shape; and the patterns of parts a slot can hold."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.core.model import GpuState, NodeState, PendingJob

Kind = tuple[str, int]
OPEN = 0  # the part size that stands for a GPU opened to fractions


@dataclass
class Slot:
    node: str
    indices: tuple[int, ...]


@dataclass
class SlotClass:
    kind: Kind
    size: int
    idle: bool
    rep: tuple[NodeState, GpuState]
    slots: list[Slot] = field(default_factory=list)


@dataclass
class GpuClass:
    kind: Kind
    free_memory_mb: int
    free_compute: int
    rep: tuple[NodeState, GpuState]
    gpus: list[tuple[str, int]] = field(default_factory=list)  # empty for opened GPUs
    opened: bool = False


def gang_class(job: PendingJob) -> tuple[int, str, int]:
    return job.gpus, job.gpu_model or "", job.min_gpu_memory_mb or 0


def frac_class(job: PendingJob) -> tuple[int, int, str, int]:
    return (
        job.gpu_memory_mb or 0,
        job.gpu_compute_percent or 0,
        job.gpu_model or "",
        (job.min_gpu_memory_mb or 0),
    )


def slot_classes(nodes: Sequence[NodeState]) -> list[SlotClass]:
    """Slots of wholly free GPUs grouped by (kind, count, idle node), nodes in name order."""
    classes: dict[tuple[Kind, int, bool], SlotClass] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        kinds: dict[Kind, list[GpuState]] = {}
        for gpu in node.gpus:
            if gpu.is_whole_free:
                kinds.setdefault((gpu.model, gpu.memory_mb), []).append(gpu)
        for kind, gpus in kinds.items():
            idle = len(gpus) == len(node.gpus)
            key = (kind, len(gpus), idle)
            cls = classes.get(key)
            if cls is None:
                cls = classes[key] = SlotClass(kind, len(gpus), idle, (node, gpus[0]))
            cls.slots.append(Slot(node.name, tuple(sorted(g.index for g in gpus))))
    return [classes[k] for k in sorted(classes)]


def partial_classes(nodes: Sequence[NodeState]) -> list[GpuClass]:
    classes: dict[tuple[Kind, int, int], GpuClass] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        for gpu in node.gpus:
            mem, comp = min(gpu.free_memory_mb, gpu.memory_mb), gpu.free_compute_percent
            if gpu.is_whole_free or mem <= 0 or comp <= 0:
                continue
            key = ((gpu.model, gpu.memory_mb), mem, comp)
            cls = classes.get(key)
            if cls is None:
                cls = classes[key] = GpuClass(key[0], mem, comp, (node, gpu))
            cls.gpus.append((node.name, gpu.index))
    return [classes[k] for k in sorted(classes)]


def patterns(size: int, parts: Mapping[int, int]) -> list[tuple[int, ...]]:
    """Non-empty multisets of part sizes (OPEN counts as one GPU) within `size` GPUs, with
    at most `parts[s]` parts of size s; each sorted largest first. Deterministic order."""
    sizes = sorted(parts, reverse=True)
    out: list[tuple[int, ...]] = []

    def extend(i: int, room: int, acc: list[int]) -> None:
        if i == len(sizes):
            if acc:
                out.append(tuple(acc))
            return
        s = sizes[i]
        gpus = max(s, 1)
        most = min(parts[s], room // gpus)
        for count in range(most, -1, -1):
            extend(i + 1, room - count * gpus, acc + [s] * count)

    extend(0, size, [])
    return out
