"""GPU health on the control side: a finding an agent sends drains its node.

An agent sends its GPUs' findings (workers/gpu/types.py `GpuFinding`: an Xid event,
uncorrectable ECC errors, a GPU lost from the bus) with every telemetry tick while they
last. Each finding is checked like a telemetry reading (a malformed one, or one naming a
GPU the node has not registered, is refused and counted on the node with the refused
telemetry). A finding that is a hardware fault drains the node: `drain_requested` is set,
an up node turns draining and `state_reason` names the GPU and the fault, e.g.

    GPU 2 (GPU-ab12...) reported XID 79 (fell off the bus); drained until staff resume it

so the scheduler places nothing new there while running jobs go on. A job on a GPU that is
really gone fails on its own (CUDA reports the error) and its exit takes the usual path,
with its own requeue settings; a job on a GPU with an ECC error may still checkpoint.
Staff resume the node (POST /api/v1/nodes/{name}/resume/) once the GPU is dealt with.

Each finding carries a key; the keys acted on are kept on the node (label `gpu-health`,
newest last), so the same finding sent again, or again after a resume, changes nothing.
Xid codes that usually mean an application's own fault (13, 31, 43, 45) are logged and do
not drain.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from fleet.models import Gpu, Node, NodeState
from fleet.services.telemetry import _count_refused

log = logging.getLogger(__name__)

HEALTH_LABEL = "gpu-health"
MAX_FINDINGS = 256  # findings in one message
MAX_KEYS = 32  # keys remembered per node
KINDS = ("xid", "ecc", "lost")
# Xids raised by an application's own error (bad memory access, a kernel stopped on
# purpose): the GPU is fine, so the node is not drained for them.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
# What the Xids an operator meets most often mean (NVIDIA's Xid catalogue).
XID_MEANING = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "fell off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP timeout",
    120: "GSP error",
}


@dataclass(frozen=True, slots=True)
class Finding:
    index: int
    uuid: str
    kind: str
    code: int | None
    key: str

    @property
    def drains(self) -> bool:
        return not (self.kind == "xid" and self.code in APPLICATION_XIDS)

    def sentence(self) -> str:
        if self.kind == "xid":
            meaning = XID_MEANING.get(self.code or 0)
            what = f"XID {self.code}" + (f" ({meaning})" if meaning else "")
        elif self.kind == "ecc":
            what = f"{self.code} uncorrectable ECC error" + ("s" if self.code != 1 else "")
        else:
            what = "that it is lost (fell off the bus)"
        uuid = self.uuid or "uuid unreadable"
        return f"GPU {self.index} ({uuid}) reported {what}; drained until staff resume it"


class Refused(ValueError):
    pass


def _whole(value: Any, high: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise Refused(f"{field}: {value!r:.40} is not a whole number between 0 and {high}")
    return value


def _text(value: Any, size: int, field: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= size or not value.isprintable():
        raise Refused(f"{field}: not printable text of 1 to {size} characters")
    return value


def _key(finding: Finding) -> str:
    """The finding's key as kept in the node's label (keys are kept space-separated)."""
    return finding.key.replace(" ", "_")


def finding_check(raw: Any) -> Finding:
    """One finding as the agent sent it, checked value by value, or Refused."""
    if not isinstance(raw, dict):
        raise Refused(f"finding: {type(raw).__name__} is not a finding")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise Refused(f"kind: {str(kind)[:20]!r} is not one of {', '.join(KINDS)}")
    code = raw.get("code")
    if kind == "lost":
        code = None
    else:
        code = _whole(code, 10**12, "code")
    uuid = raw.get("uuid")
    return Finding(
        index=_whole(raw.get("index"), 1023, "index"),
        # A GPU lost before the agent could read its uuid is named by its index alone.
        uuid="" if kind == "lost" and uuid == "" else _text(uuid, 100, "uuid"),
        kind=kind,
        code=code,
        key=_text(raw.get("key"), 200, "key"),
    )


def gpu_findings_apply(*, node: Node, findings: Any) -> list[str]:
    """Apply one health message of `node`; returns the sentences of the findings that
    drained it now (empty when every finding was seen before, or none drains)."""
    refused: Counter[str] = Counter()
    example = ""
    if not isinstance(findings, list):
        findings = [findings]
    if len(findings) > MAX_FINDINGS:
        refused["gpu_health"] += len(findings) - MAX_FINDINGS
        example = f"gpu_health: more than {MAX_FINDINGS} findings in one message"
        findings = findings[:MAX_FINDINGS]
    checked = []
    for raw in findings:
        try:
            checked.append(finding_check(raw))
        except Refused as exc:
            refused["gpu_health"] += 1
            example = example or f"gpu_health {exc}"
    gpus = dict(Gpu.objects.filter(node=node).values_list("uuid", "index"))
    valid = []
    taken = {index: uuid for uuid, index in gpus.items()}
    for finding in checked:
        # A GPU lost before the agent could register it (its uuid may be unreadable) is not
        # one of this node's GPUs: it is taken at its word for an index no GPU holds.
        unregistered = finding.kind == "lost" and finding.index not in taken
        if not unregistered and gpus.get(finding.uuid) != finding.index:
            refused["gpu_health"] += 1
            example = example or (
                f"gpu_health uuid: {finding.uuid[:40]} is not GPU {finding.index} of this node"
            )
        else:
            valid.append(finding)
    if refused:
        _count_refused(node, refused, example)
    for finding in valid:
        if not finding.drains:
            log.info(
                "node %s GPU %d reported XID %s, an application's error; not drained",
                node.name,
                finding.index,
                finding.code,
            )
    wanted = [f for f in valid if f.drains]
    if not wanted:
        return []
    # Findings come every tick while they last: most were acted on before, and those need
    # no lock on the node.
    labels_now = Node.objects.filter(pk=node.pk).values_list("labels", flat=True).first()
    known = str((labels_now or {}).get(HEALTH_LABEL) or "").split()
    if all(_key(f) in known for f in wanted):
        return []
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.pk)
        labels = dict(locked.labels or {})
        seen = str(labels.get(HEALTH_LABEL) or "").split()
        new: list[Finding] = []
        for finding in wanted:
            if _key(finding) not in seen and finding not in new:
                new.append(finding)
        if not new:
            return []
        seen += [_key(f) for f in new]
        labels[HEALTH_LABEL] = " ".join(seen[-MAX_KEYS:])
        sentences = [f.sentence() for f in new]
        reason = "; ".join(sentences)
        if locked.drain_requested and locked.state_reason:
            reason = f"{reason}; before: {locked.state_reason}"
        fields: dict[str, Any] = {
            "labels": labels,
            "drain_requested": True,
            "state_reason": reason[:500],
        }
        if locked.state == NodeState.UP:
            fields["state"] = NodeState.DRAINING
        Node.objects.filter(pk=node.pk).update(**fields)
    for sentence in sentences:
        log.error("node %s: %s", node.name, sentence)
    return sentences
