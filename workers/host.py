"""What the agent's host offers jobs, as its registration reports it (`host`).

CPUs and memory default to what the host has (the CPUs this process may run on, total
memory); FLEET_NODE_CPUS and FLEET_NODE_MEMORY_MB offer less, e.g. to keep some for the
host's own services. A simulated agent may be given any shape, so one machine can stand in
for a fleet. FLEET_NODE_ADDRESS is how the other members of a multi-node job reach this
host (rank 0's address becomes MASTER_ADDR): default the address of the interface that
routes outward, or 127.0.0.1 for a simulated agent. FLEET_NODE_GROUP names the host's
topology group (rack, switch), which the scheduler keeps a gang's members within.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from workers.executor.spec import ExecutorError, check_address

_GROUP = re.compile(r"^[A-Za-z0-9._-]{0,64}$")


@dataclass(frozen=True, slots=True)
class HostShape:
    cpus: int
    memory_mb: int
    address: str
    group: str = ""

    def message(self, enforcement: str) -> dict[str, Any]:
        """The registration's `host`."""
        return {
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
            "address": self.address,
            "group": self.group,
            "enforcement": enforcement,
        }


def host_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_memory_mb() -> int:
    return int(psutil.virtual_memory().total) >> 20


def primary_address() -> str:
    """The address of the interface that routes outward (no packet is sent), else
    127.0.0.1."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            address = probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    return str(address) if address and address != "0.0.0.0" else "127.0.0.1"


def _offer(env: Mapping[str, str], name: str, has: int, unit: str, simulated: bool) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return has
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={raw!r} is not a whole number of {unit} above 0")
    if value > has and not simulated:
        raise ValueError(
            f"{name}={value} is more than the {has} {unit} this host has; an agent may offer "
            "less than its host has, never more"
        )
    return value


def host_shape(env: Mapping[str, str] | None = None, *, simulated: bool = False) -> HostShape:
    """The host's offer from FLEET_NODE_* (default: os.environ); ValueError says which
    setting is wrong and how."""
    env = os.environ if env is None else env
    address = env.get("FLEET_NODE_ADDRESS", "").strip()
    if address:
        try:
            check_address(address, "FLEET_NODE_ADDRESS")
        except ExecutorError as exc:
            raise ValueError(str(exc)) from None
    else:
        address = "127.0.0.1" if simulated else primary_address()
    group = env.get("FLEET_NODE_GROUP", "").strip()
    if not _GROUP.match(group):
        raise ValueError(
            f"FLEET_NODE_GROUP={group!r} must be at most 64 letters, digits, '.', '-' or '_'"
        )
    return HostShape(
        cpus=_offer(env, "FLEET_NODE_CPUS", host_cpus(), "CPUs", simulated),
        memory_mb=_offer(env, "FLEET_NODE_MEMORY_MB", host_memory_mb(), "MB of memory", simulated),
        address=address,
        group=group,
    )
