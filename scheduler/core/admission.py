"""Admission control: refuse at submit time a job that could never start.

Checked against every node the fleet lists (down or draining ones too: they come back),
and the team's hard limit and per-user cap. Messages name the numbers so a person can fix
the request ("needs 16 GPUs on one node; the largest node has 8").

A multi-node gang is checked member by member: its GPUs split evenly into members of
`gpus_per_node`, enough nodes that could each hold one (GPUs of one kind, host CPUs and
memory), and, with `same_group`, enough of them in one topology group. Host CPUs and
memory asked per node must fit the largest node reporting them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scheduler.core._capacity_index import host_request, node_count, per_node_gpus
from scheduler.core.model import FULL_COMPUTE, NodeState, TeamState, is_mig_device
from scheduler.core.quota import host_share

# What FleetProfile.fleet_error reads of a job.
FLEET_FIELDS = (
    "gpus",
    "gpu_compute_percent",
    "gpu_memory_mb",
    "gpu_model",
    "min_gpu_memory_mb",
    "gpus_per_node",
    "cpus",
    "memory_mb",
    "same_group",
)


class FleetProfile:
    """What admission needs to know of the fleet, computed once: the GPU models, and per
    GPU kind (model, memory) the most GPUs of that kind on one node; per node its GPU
    counts by kind, host CPUs and memory (None: not reported) and group."""

    def __init__(self, nodes: Iterable[NodeState]) -> None:
        self.kinds: dict[tuple[str, int], int] = {}
        self.nodes: list[tuple[dict[tuple[str, int], int], int | None, int | None, str]] = []
        for node in nodes:
            per_kind: dict[tuple[str, int], int] = {}
            for g in node.gpus:
                key = (g.model, g.memory_mb)
                per_kind[key] = per_kind.get(key, 0) + 1
            for key, count in per_kind.items():
                self.kinds[key] = max(self.kinds.get(key, 0), count)
            self.nodes.append((per_kind, node.cpus, node.memory_mb, node.group))
        self.models = sorted({model for model, _ in self.kinds})
        # The most host CPUs and memory of one node; None when some node does not report
        # them (it is not limited by them, so nothing is too big).
        cpus = [c for _, c, _, _ in self.nodes if c is not None]
        mems = [m for _, _, m, _ in self.nodes if m is not None]
        count = len(self.nodes)
        self.most_cpus = max(cpus, default=0) if len(cpus) == count else None
        self.most_memory = max(mems, default=0) if len(mems) == count else None
        self._gang_errors: dict[tuple[Any, ...], str | None] = {}

    def error(self, job: Any, team: TeamState | None) -> str | None:
        """Why the job can never start on this fleet under this team's limits, or None."""
        error = self.fleet_error(job)
        return error if error is not None else limit_error(job, team)

    def fleet_error(self, job: Any) -> str | None:
        """Why the job can never start on this fleet whatever its team, or None: what
        `error` says before the team's limits. It reads only FLEET_FIELDS of the job."""
        if job.gpus < 0:
            return (
                f"asks for {job.gpus} GPUs; ask for 1 or more, or 0 with a memory and compute share"
            )
        shape_error = _shape_error(job)
        if shape_error is not None:
            return shape_error
        if not self.kinds:
            return "the fleet has no GPUs yet"
        if job.gpus == 0:
            comp = job.gpu_compute_percent or 0
            if not 1 <= comp <= FULL_COMPUTE:
                return f"asks for {comp} % of one GPU; a fractional job takes 1 to {FULL_COMPUTE} %"
            if (job.gpu_memory_mb or 0) <= 0:
                return "a fractional job must ask for some GPU memory (MB)"
        if job.gpu_model is not None and job.gpu_model not in self.models:
            return f"no node has {job.gpu_model} GPUs; the fleet has {', '.join(self.models)}"
        of_model = {
            k: n for k, n in self.kinds.items() if job.gpu_model is None or k[0] == job.gpu_model
        }
        if job.gpus and per_node_gpus(job) > 1:
            # A CUDA process uses one MIG device: several on a node are no use to one job.
            of_model = {k: n for k, n in of_model.items() if not is_mig_device(k[0])}
            if not of_model:
                what = (
                    f"{job.gpu_model} is a MIG device"
                    if job.gpu_model
                    else ("every GPU of the fleet is a MIG device")
                )
                return (
                    f"needs {per_node_gpus(job)} GPUs on one node, and {what}, of which a job "
                    "can use only one per node; ask for 1 GPU per node (gpus_per_node 1) or "
                    "for a whole-GPU model"
                )
        label = f"{job.gpu_model} " if job.gpu_model else ""
        largest = max(mem for _, mem in of_model)
        if job.min_gpu_memory_mb is not None and job.min_gpu_memory_mb > largest:
            return (
                f"needs a {label}GPU with at least {job.min_gpu_memory_mb} MB; "
                f"the largest {label}GPU has {largest} MB"
            )
        if job.gpus == 0:
            mem = job.gpu_memory_mb or 0
            if mem > largest:
                return (
                    f"asks for {mem} MB of one {label}GPU; the largest {label}GPU has {largest} MB"
                )
        else:
            most = max(
                (n for (_, mem), n in of_model.items() if mem >= (job.min_gpu_memory_mb or 0)),
                default=0,
            )
            per = per_node_gpus(job)
            plural = "s" if per != 1 else ""
            where = "on each node" if node_count(job) > 1 else "on one node"
            if per > most:
                return f"needs {per} {label}GPU{plural} {where}; the largest node has {most}"
        host_error = self._host_error(job)
        if host_error is not None:
            return host_error
        if job.gpus and node_count(job) > 1:
            gang_error = self._gang_error(job, of_model, label)
            if gang_error is not None:
                return gang_error
        return None

    def _host_error(self, job: Any) -> str | None:
        cpus, memory_mb = host_request(job)
        if cpus and self.most_cpus is not None and cpus > self.most_cpus:
            return f"needs {cpus} CPU cores per node; the largest node has {self.most_cpus}"
        if memory_mb and self.most_memory is not None and memory_mb > self.most_memory:
            return (
                f"needs {megabytes(memory_mb)} of host memory per node; the largest node "
                f"has {megabytes(self.most_memory)}"
            )
        return None

    def _gang_error(self, job: Any, of_model: dict[tuple[str, int], int], label: str) -> str | None:
        """Too few nodes could each hold a member (or, with same_group, too few in one
        group): counted per GPU kind the job may use, host CPUs and memory included."""
        need, per = node_count(job), per_node_gpus(job)
        cpus, memory_mb = host_request(job)
        key = (job.gpu_model, job.min_gpu_memory_mb, need, per, cpus, memory_mb, job.same_group)
        if key not in self._gang_errors:
            self._gang_errors[key] = self._count_holders(job, of_model, label)
        return self._gang_errors[key]

    def _count_holders(
        self, job: Any, of_model: dict[tuple[str, int], int], label: str
    ) -> str | None:
        need, per = node_count(job), per_node_gpus(job)
        cpus, memory_mb = host_request(job)
        best = 0
        best_group = 0
        for kind in of_model:
            if kind[1] < (job.min_gpu_memory_mb or 0):
                continue
            holders = 0
            groups: dict[str, int] = {}
            for per_kind, c, m, group in self.nodes:
                if per_kind.get(kind, 0) < per:
                    continue
                if (c is not None and c < cpus) or (m is not None and m < memory_mb):
                    continue
                holders += 1
                if group:
                    groups[group] = groups.get(group, 0) + 1
            best = max(best, holders)
            best_group = max(best_group, max(groups.values(), default=0))
        each = f"{per} {label}GPU{'s' if per != 1 else ''} each"
        if cpus or memory_mb:
            each += " and the host CPUs and memory it asks for"
        if best < need:
            return f"needs {need} nodes with {each}; the fleet has {best}"
        if job.same_group and best_group < need:
            if not any(group for _, _, _, group in self.nodes):
                return (
                    f"must keep its {need} nodes in one topology group, and no node reports "
                    "a group; turn off same_group or ask an admin to set node groups"
                )
            return (
                f"must keep its {need} nodes in one topology group; the largest group has "
                f"{best_group} nodes with {each}"
            )
        return None


_last_profile: tuple[tuple[NodeState, ...], FleetProfile] | None = None


def fleet_profile(nodes: Iterable[NodeState]) -> FleetProfile:
    """The profile of these nodes, reused while callers pass the same (immutable) tuple,
    so checking every waiting job of a snapshot does not rescan the fleet each time."""
    global _last_profile
    if isinstance(nodes, tuple) and _last_profile is not None and _last_profile[0] is nodes:
        return _last_profile[1]
    profile = FleetProfile(nodes)
    if isinstance(nodes, tuple):
        _last_profile = (nodes, profile)
    return profile


def admission_error(job: Any, nodes: Iterable[NodeState], team: TeamState | None) -> str | None:
    """Why the job can never start on this fleet under this team's limits, or None."""
    return fleet_profile(nodes).error(job, team)


def megabytes(mb: int) -> str:
    """'64 GB' for whole gigabytes, else '1500 MB'."""
    return f"{mb // 1024} GB" if mb and mb % 1024 == 0 else f"{mb} MB"


def _shape_error(job: Any) -> str | None:
    """Requests that make no sense whatever the fleet: negative host needs, members that
    do not split the GPUs evenly, a fraction spread over nodes."""
    per = getattr(job, "gpus_per_node", 0) or 0
    cpus, memory_mb = host_request(job)
    if cpus < 0 or memory_mb < 0:
        return "asks for a negative number of CPU cores or memory; ask for 0 or more"
    if per < 0:
        return f"asks for {per} GPUs per node; ask for 1 or more, or 0 for all on one node"
    if per and job.gpus == 0:
        return "a fractional job runs on one GPU; leave gpus_per_node at 0"
    if per and job.gpus > per and job.gpus % per:
        return (
            f"asks for {job.gpus} GPUs in members of {per} GPUs per node; the total must be "
            f"a multiple of {per} (for example {per * max(1, job.gpus // per)} or "
            f"{per * (job.gpus // per + 1)})"
        )
    return None


def limit_error(job: Any, team: TeamState | None) -> str | None:
    """Why the job is above its team's hard limits or per-user cap, or None."""
    if team is None:
        return None
    need = job.gpu_equivalent
    shown = f"{need:g}"
    if team.hard_limit_gpus is not None and need > team.hard_limit_gpus:
        return f"needs {shown} GPUs; team {team.slug}'s hard limit is {team.hard_limit_gpus}"
    if team.user_gpu_cap is not None and need > team.user_gpu_cap:
        return f"needs {shown} GPUs; the per-user cap in team {team.slug} is {team.user_gpu_cap}"
    return host_limit_error(job, team)


def host_limit_error(job: Any, team: TeamState) -> str | None:
    """Why the whole job (every node's CPUs and memory) is above its team's host limits."""
    if team.hard_limit_cpus is None and team.hard_limit_memory_mb is None:
        return None
    cpus, memory = host_share(job)
    if team.hard_limit_cpus is not None and cpus > team.hard_limit_cpus:
        return (
            f"needs {cpus} CPU cores over all its nodes; team {team.slug}'s limit is "
            f"{team.hard_limit_cpus} CPU cores"
        )
    if team.hard_limit_memory_mb is not None and memory > team.hard_limit_memory_mb:
        return (
            f"needs {memory} MB of host memory over all its nodes; team {team.slug}'s limit "
            f"is {team.hard_limit_memory_mb} MB"
        )
    return None
