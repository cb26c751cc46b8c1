"""Confining each job's CPUs and memory with cgroups v2.

Where the agent may create cgroups v2 with the cpu and memory controllers (root on a host
with the unified hierarchy, or a subtree delegated to the agent's account, e.g. systemd's
`Delegate=yes`), each attempt runs in its own cgroup under the agent's root
(`FLEET_CGROUP_ROOT`, default `<cgroup2 mount>/fleet/<node>`): `cpu.max` holds it to the
CPUs it asked for, `memory.max` to its memory (the kernel's OOM killer acts inside the
cgroup, not on the host), and every process it starts stays in the cgroup whatever
session or process group it makes, so the agent removes them all when the attempt ends.
The shim joins the cgroup before it starts the job (so the job is confined from its first
instruction) and goes back to its own cgroup right after, so the job's limits never count
or kill the shim.

Where that is not possible the agent runs jobs unconfined and says why in its
registration (`Enforcement.note`, "none: <why>"), so the control side and the fleet page
can show which nodes enforce what they promise. Standard library only.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

CPU_PERIOD_US = 100_000
CONTROLLERS = ("cpu", "memory")
ENFORCED = "cgroup-v2"
OFF = ("off", "none", "0")


@dataclass(frozen=True, slots=True)
class Enforcement:
    """How this agent confines jobs. `root`: the cgroup under which each attempt gets its
    own (None: jobs run unconfined); `mount`: where the cgroup v2 hierarchy is mounted;
    `note`: "cgroup-v2", or "none: <a sentence saying why not>"."""

    note: str
    root: Path | None = None
    mount: Path | None = None

    @property
    def enforced(self) -> bool:
        return self.root is not None


def cgroup2_mount(mounts: str) -> Path | None:
    """The mount point of the cgroup v2 hierarchy in /proc/self/mounts text, if any."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def _tokens(path: Path) -> set[str]:
    try:
        return {t.lstrip("+") for t in path.read_text().split()}
    except OSError:
        return set()


def _missing(path: Path) -> list[str]:
    have = _tokens(path / "cgroup.controllers")
    return [c for c in CONTROLLERS if c not in have]


def _none(why: str) -> Enforcement:
    return Enforcement(note=f"none: {why}")


def probe(
    node: str,
    root: str | os.PathLike[str] | None = None,
    *,
    mounts_file: str = "/proc/self/mounts",
    mount: str | os.PathLike[str] | None = None,
) -> Enforcement:
    """Find out whether jobs can be confined here, and prepare the agent's cgroup root.

    `root` is FLEET_CGROUP_ROOT ("off" turns confinement off); by default
    `<mount>/fleet/<node>`. `mount` replaces the cgroup v2 mount point read from
    `mounts_file` (tests point both at a temporary directory)."""
    if root is not None and str(root).strip().lower() in OFF:
        return _none("confinement is turned off (FLEET_CGROUP_ROOT=off)")
    if mount is None:
        try:
            found = cgroup2_mount(Path(mounts_file).read_text())
        except OSError as exc:
            return _none(f"cannot read {mounts_file} to find cgroup v2 ({exc.strerror})")
        if found is None:
            return _none("no cgroup v2 hierarchy is mounted (this host uses cgroup v1 only)")
        mount = found
    mount = Path(mount)
    missing = _missing(mount)
    if missing:
        return _none(
            f"cgroup v2 at {mount} does not offer the {' and '.join(missing)} "
            "controller" + ("s" if len(missing) > 1 else "") + " (this host keeps them on "
            "cgroup v1, or they are not delegated to it)"
        )
    base = Path(root) if root else mount / "fleet" / re.sub(r"[^A-Za-z0-9_.-]", "_", node)
    try:
        below = base.resolve().relative_to(mount.resolve())
    except ValueError:
        return _none(f"FLEET_CGROUP_ROOT={base} is not inside the cgroup v2 hierarchy at {mount}")
    # Each cgroup from the mount down to the root hands the controllers to its children.
    chain = [mount.joinpath(*below.parts[:i]) for i in range(len(below.parts) + 1)]
    for parent, child in zip(chain, chain[1:], strict=False):
        if _missing(parent):
            return _none(f"{parent} does not offer the cpu and memory controllers")
        step = _enable(parent)
        if step:
            return _none(step)
        try:
            child.mkdir(exist_ok=True)
        except OSError as exc:
            return _none(f"{parent} is not writable by the agent ({exc.strerror})")
    step = _enable(base)
    if step:
        return _none(step)
    return Enforcement(note=ENFORCED, root=base, mount=mount)


def _enable(cgroup: Path) -> str | None:
    """Hand cpu and memory to `cgroup`'s children; None, or why it could not."""
    control = cgroup / "cgroup.subtree_control"
    if all(c in _tokens(control) for c in CONTROLLERS):
        return None
    try:
        control.write_text(" ".join(f"+{c}" for c in CONTROLLERS))
    except OSError as exc:
        return f"{control} is not writable by the agent ({exc.strerror})"
    return None


def job_cgroup_create(root: Path, name: str, *, cpus: int, memory_mb: int) -> Path:
    """A fresh cgroup for one attempt with its limits written (0: no limit). Raises
    OSError."""
    path = root / name
    path.mkdir(exist_ok=True)
    quota = f"{cpus * CPU_PERIOD_US} {CPU_PERIOD_US}" if cpus else f"max {CPU_PERIOD_US}"
    (path / "cpu.max").write_text(quota)
    (path / "memory.max").write_text(str(memory_mb << 20) if memory_mb else "max")
    swap = path / "memory.swap.max"
    if memory_mb and swap.exists():  # absent where swap is not accounted
        swap.write_text("0")
    return path


def job_cgroup_remove(path: str | os.PathLike[str], wait_s: float = 5.0) -> bool:
    """Kill whatever is left in an ended attempt's cgroup (processes that left the job's
    process group) and remove it; False when it could not be removed."""
    path = Path(path)
    if not path.exists():
        return True
    kill = path / "cgroup.kill"
    if kill.exists():
        try:
            kill.write_text("1")
        except OSError as exc:
            logger.warning("cannot kill what is left in %s: %s", path, exc)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            path.rmdir()
            return True
        except OSError as exc:
            # EBUSY: its last processes are still exiting. Anything else will not pass.
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                logger.warning("cannot remove the job cgroup %s: %s", path, exc.strerror)
                return False
        time.sleep(0.05)


def oom_kills(path: str | os.PathLike[str]) -> int:
    """How many of the cgroup's processes the kernel killed at its memory limit
    (memory.events `oom_kill`); 0 when unknown."""
    try:
        for line in (Path(path) / "memory.events").read_text().splitlines():
            name, _, count = line.partition(" ")
            if name == "oom_kill":
                return int(count)
    except (OSError, ValueError):
        pass
    return 0
