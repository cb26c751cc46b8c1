"""Cluster specs for the simulator: `8x8xV100` (nodes x GPUs per node x model) and mixes
joined by `+`, such as `4x8xV100+2x4xA100-80GB`.

GPU memory comes from a table of known models; unknown models get 32 GB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scheduler.core.model import FULL_COMPUTE, GpuState, NodeState

DEFAULT_MEMORY_MB = 32 * 1024

# Memory of the common data-centre parts, in MiB. Bare names take the larger variant most
# clusters bought (V100 32 GB, A100 80 GB is spelled out because 40 GB was common too).
GPU_MEMORY_MB: dict[str, int] = {
    "K80": 12 * 1024,
    "P40": 24 * 1024,
    "P100": 16 * 1024,
    "T4": 16 * 1024,
    "V100": 32 * 1024,
    "V100-16GB": 16 * 1024,
    "V100-32GB": 32 * 1024,
    "A10": 24 * 1024,
    "A30": 24 * 1024,
    "A40": 48 * 1024,
    "A100": 40 * 1024,
    "A100-40GB": 40 * 1024,
    "A100-80GB": 80 * 1024,
    "L4": 24 * 1024,
    "L40": 48 * 1024,
    "L40S": 48 * 1024,
    "H100": 80 * 1024,
    "H100-80GB": 80 * 1024,
    "H200": 141 * 1024,
    "RTX3090": 24 * 1024,
    "RTX4090": 24 * 1024,
    "RTX6000": 48 * 1024,
}

_PART = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*x\s*([A-Za-z0-9][A-Za-z0-9_.-]*)\s*$")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: int
    model: str
    memory_mb: int


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]
    text: str = ""

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def max_node_gpus(self) -> int:
        return max((n.gpus for n in self.nodes), default=0)

    def node_states(self) -> tuple[NodeState, ...]:
        """The empty cluster as snapshot nodes."""
        return tuple(
            NodeState(
                name=n.name,
                gpus=tuple(
                    GpuState(i, n.model, n.memory_mb, n.memory_mb, FULL_COMPUTE)
                    for i in range(n.gpus)
                ),
            )
            for n in self.nodes
        )


def gpu_memory_mb(model: str) -> int:
    return GPU_MEMORY_MB.get(model.upper(), DEFAULT_MEMORY_MB)


def parse_cluster(text: str) -> ClusterSpec:
    """Parse `NxGxMODEL[+NxGxMODEL...]`; raises ValueError with the offending part."""
    if not text or not text.strip():
        raise ValueError("empty cluster spec; expected e.g. 8x8xV100 or 4x8xV100+2x4xA100-80GB")
    nodes: list[NodeSpec] = []
    for part in text.split("+"):
        m = _PART.match(part)
        if not m:
            raise ValueError(
                f"cannot read cluster part {part.strip()!r}; expected NODESxGPUSxMODEL, "
                "e.g. 8x8xV100"
            )
        count, gpus, model = int(m.group(1)), int(m.group(2)), m.group(3)
        if count < 1 or gpus < 1:
            raise ValueError(f"cluster part {part.strip()!r} needs at least 1 node and 1 GPU")
        prefix = model.lower().replace(".", "-").replace("_", "-")
        start = sum(1 for n in nodes if n.model == model)
        for i in range(count):
            nodes.append(NodeSpec(f"{prefix}-{start + i:03d}", gpus, model, gpu_memory_mb(model)))
    return ClusterSpec(tuple(nodes), text.strip())
