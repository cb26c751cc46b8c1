"""Cluster specs for the simulator: `8x8xV100` (nodes x GPUs per node x model) and mixes
joined by `+`, such as `4x8xV100+2x4xA100-80GB`.

Each part may end with options in brackets, `16x4xT4[cpus=32,mem=256,group=4]`:
- `cpus=N`: host CPU cores per node; `mem=GB`: host memory per node in GiB. A node without
  them is not limited by CPUs or memory (the snapshot reports None).
- `group=K`: K consecutive nodes share a topology group (rack, switch), named `g000`,
  `g001`... across the whole cluster. `parse_cluster(..., nodes_per_group=K)` applies K to
  every part that names none. Without either, nodes have no group ("").

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

_PART = re.compile(
    r"^\s*(\d+)\s*x\s*(\d+)\s*x\s*([A-Za-z0-9][A-Za-z0-9_.-]*)\s*(?:\[([^\]]*)\])?\s*$"
)
_OPTIONS = ("cpus", "mem", "group")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: int
    model: str
    memory_mb: int  # of each GPU
    # Host CPU cores and memory (MiB); None: not limited.
    cpus: int | None = None
    host_memory_mb: int | None = None
    group: str = ""


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
                cpus=n.cpus,
                memory_mb=n.host_memory_mb,
                free_cpus=n.cpus,
                free_memory_mb=n.host_memory_mb,
                group=n.group,
            )
            for n in self.nodes
        )

    @property
    def groups(self) -> int:
        """How many topology groups the nodes form (0 when none is named)."""
        return len({n.group for n in self.nodes if n.group})


def gpu_memory_mb(model: str) -> int:
    return GPU_MEMORY_MB.get(model.upper(), DEFAULT_MEMORY_MB)


def _options(part: str, text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in _OPTIONS:
            raise ValueError(
                f"cannot read option {item.strip()!r} of cluster part {part.strip()!r}; "
                "expected cpus=N, mem=GB or group=NODES, e.g. 16x4xT4[cpus=32,mem=256,group=4]"
            )
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            raise ValueError(
                f"option {key} of cluster part {part.strip()!r} must be a whole number >= 1, "
                f"not {value.strip()!r}"
            )
        out[key] = number
    return out


def parse_cluster(text: str, *, nodes_per_group: int | None = None) -> ClusterSpec:
    """Parse `NxGxMODEL[opts][+NxGxMODEL[opts]...]`; raises ValueError naming the offending
    part. `nodes_per_group` groups the nodes of every part that sets no `group=`."""
    if not text or not text.strip():
        raise ValueError("empty cluster spec; expected e.g. 8x8xV100 or 4x8xV100+2x4xA100-80GB")
    if nodes_per_group is not None and nodes_per_group < 1:
        raise ValueError(f"nodes per group must be 1 or more, not {nodes_per_group}")
    nodes: list[NodeSpec] = []
    groups = 0
    for part in text.split("+"):
        m = _PART.match(part)
        if not m:
            raise ValueError(
                f"cannot read cluster part {part.strip()!r}; expected NODESxGPUSxMODEL, "
                "e.g. 8x8xV100 or 16x4xT4[cpus=32,mem=256,group=4]"
            )
        count, gpus, model = int(m.group(1)), int(m.group(2)), m.group(3)
        if count < 1 or gpus < 1:
            raise ValueError(f"cluster part {part.strip()!r} needs at least 1 node and 1 GPU")
        opts = _options(part, m.group(4))
        per_group = opts.get("group", nodes_per_group)
        mem = opts.get("mem")
        prefix = model.lower().replace(".", "-").replace("_", "-")
        start = sum(1 for n in nodes if n.model == model)
        for i in range(count):
            group = ""
            if per_group:
                group = f"g{groups + i // per_group:03d}"
            nodes.append(
                NodeSpec(
                    f"{prefix}-{start + i:03d}",
                    gpus,
                    model,
                    gpu_memory_mb(model),
                    cpus=opts.get("cpus"),
                    host_memory_mb=None if mem is None else mem * 1024,
                    group=group,
                )
            )
        if per_group:
            groups += -(-count // per_group)
    return ClusterSpec(tuple(nodes), text.strip())
