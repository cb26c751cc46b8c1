"""What an agent says about its host and GPUs when it registers: the GPU rows kept in step
with its inventory (a GPU of another node refused), and the host's cores, memory, address,
group and job confinement checked value by value (fleet.services.agents applies them)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db.models import Q

from fleet.models import Gpu, Node, NodeState
from scheduler.cycle.admission import fleet_shape_changed

log = logging.getLogger(__name__)

# What a registration's `host` may say: an agent offers jobs at most this much of its host.
MAX_HOST_CPUS = 65_536
MAX_HOST_MEMORY_MB = 2**31 - 1  # 2 PiB; the column's limit
HOST_TEXT = {"address": 255, "group": 100, "enforcement": 300}


def host_check(host: Any) -> tuple[dict[str, Any], list[str]]:
    """The Node fields a registration's `host` sets, and why any value in it was refused.

    A value of the wrong type or out of range (negative cores, memory of 10**30 MB, a
    float, a boolean, an address of 5 kB) is refused alone and the node keeps what it had;
    the rest is stored."""
    if host is None:
        return {}, []
    if not isinstance(host, dict):
        return {}, [f"host must be an object, not {type(host).__name__}"]
    fields: dict[str, Any] = {}
    refused: list[str] = []
    for name, high in (("cpus", MAX_HOST_CPUS), ("memory_mb", MAX_HOST_MEMORY_MB)):
        if name not in host:
            continue
        value = host[name]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            refused.append(f"{name} {value!r} is not a whole number between 0 and {high}")
        else:
            fields[name] = value
    for name, size in HOST_TEXT.items():
        if name not in host:
            continue
        value = host[name]
        if not isinstance(value, str) or len(value) > size or not value.isprintable():
            refused.append(f"{name} must be printable text of at most {size} characters")
        else:
            fields["resource_enforcement" if name == "enforcement" else name] = value.strip()
    return fields, refused


# The start of a node's state_reason while its registration names GPUs of other nodes.
REFUSED_GPUS_REASON = "refused GPUs registered to another node"


def gpu_inventory_sync(node: Node, gpus: Sequence[dict[str, Any]]) -> list[str]:
    """Make the node's GPU rows match the inventory; returns what was refused.

    A GPU is its uuid: one that moved to another index of this node is recreated there;
    model and memory are updated in place. A uuid that belongs to another node is refused
    (that GPU's row and history stay as they are): a host cannot take another's GPU by
    naming it. A GPU that really moved is released when its old node's agent registers
    without it (agents register every minute) or when an admin deletes the old node or
    that GPU's row; the new node's next registration then adds it."""
    wanted = {str(g["uuid"]): g for g in gpus}
    rows = list(Gpu.objects.filter(Q(node=node) | Q(uuid__in=list(wanted))).select_related("node"))
    refused = []
    for other in rows:
        if other.node_id != node.pk:
            del wanted[other.uuid]
            refused.append(f"{other.uuid} (node {other.node.name})")
            log.warning(
                "node %s registered GPU %s, which is registered to node %s: refused",
                node.name,
                other.uuid,
                other.node.name,
            )
    rows = [r for r in rows if r.node_id == node.pk]
    stale = [r.pk for r in rows if r.uuid not in wanted or r.index != int(wanted[r.uuid]["index"])]
    if stale:
        Gpu.objects.filter(pk__in=stale).delete()
    kept = {r.uuid: r for r in rows if r.pk not in stale}
    for uuid, info in wanted.items():
        model, memory = str(info["model"]), int(info["memory_total_mb"])
        row = kept.get(uuid)
        if row is None:
            Gpu.objects.create(
                node=node, index=int(info["index"]), uuid=uuid, model=model, memory_mb=memory
            )
        elif (row.model, row.memory_mb) != (model, memory):
            Gpu.objects.filter(pk=row.pk).update(model=model, memory_mb=memory)
            fleet_shape_changed()
    return refused


def refused_gpus_note(node: Node, refused: list[str]) -> None:
    """Say on an up node why GPUs of its inventory are missing (its state_reason, which
    the node pages and API show), and clear that once its registration is accepted whole.
    A draining or down node keeps its own reason; the refusal is in the log."""
    mine = Node.objects.filter(pk=node.pk, state=NodeState.UP)
    if refused:
        note = f"{REFUSED_GPUS_REASON}: {', '.join(refused)}"
        mine.filter(Q(state_reason="") | Q(state_reason__startswith=REFUSED_GPUS_REASON)).update(
            state_reason=note[:500]
        )
    else:
        mine.filter(state_reason__startswith=REFUSED_GPUS_REASON).update(state_reason="")
