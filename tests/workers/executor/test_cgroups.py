"""Holding each job to its CPUs and memory with cgroups v2.

The machine these tests were written on keeps the cpu and memory controllers on cgroup v1
(its cgroup v2 mount, /sys/fs/cgroup/unified, offers neither), so the agent cannot confine
jobs there and says so. The code that prepares the hierarchy and writes each job's cgroup
files is therefore tested against a temporary directory standing in for the cgroup v2
mount: it checks what the agent writes (cpu.max, memory.max, cgroup.procs), not that the
kernel enforces it. The last test runs a job in a real cgroup and sees the kernel kill it at
its memory limit, on hosts where the agent can confine jobs; elsewhere it is skipped with
the agent's reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.workers.executor.helpers import Agent, wait_for
from workers.executor import ExecutorError
from workers.executor.cgroups import Enforcement, cgroup2_mount, probe

MOUNTS_V1 = "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
MOUNTS_V2 = MOUNTS_V1 + "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"


def fake_hierarchy(
    mount: Path, *below: str, controllers: str = "cpuset cpu io memory pids"
) -> None:
    """What the kernel shows in each cgroup: the controllers its parent hands down."""
    for path in [mount, *(mount / b for b in below)]:
        path.mkdir(parents=True, exist_ok=True)
        (path / "cgroup.controllers").write_text(controllers + "\n")
        (path / "cgroup.subtree_control").write_text("")


def own_cgroup() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:].strip().lstrip("/")
    return ""


def test_the_agent_prepares_its_root_and_hands_cpu_and_memory_down(tmp_path: Path) -> None:
    fake_hierarchy(tmp_path, "fleet", "fleet/sim-a")

    found = probe("sim-a", mount=tmp_path)

    assert found == Enforcement(note="cgroup-v2", root=tmp_path / "fleet" / "sim-a", mount=tmp_path)
    for path in (tmp_path, tmp_path / "fleet", tmp_path / "fleet" / "sim-a"):
        assert (path / "cgroup.subtree_control").read_text() == "+cpu +memory"


@pytest.mark.parametrize(
    ("mounts", "controllers", "root", "says"),
    [
        (MOUNTS_V1, "", None, "none: no cgroup v2 hierarchy is mounted"),
        (MOUNTS_V2, "cpuset io", None, "does not offer the cpu and memory controllers"),
        (MOUNTS_V2, "cpu io", None, "does not offer the memory controller"),
        (MOUNTS_V2, "cpu memory", "off", "none: confinement is turned off"),
        (MOUNTS_V2, "cpu memory", "/tmp/elsewhere", "is not inside the cgroup v2 hierarchy"),
    ],
)
def test_where_jobs_cannot_be_confined_the_agent_says_why(
    tmp_path: Path, mounts: str, controllers: str, root: str | None, says: str
) -> None:
    fake_hierarchy(tmp_path, controllers=controllers)
    (tmp_path / "mounts").write_text(mounts.replace("/sys/fs/cgroup/unified", str(tmp_path)))

    found = probe("sim-a", root, mounts_file=str(tmp_path / "mounts"))

    assert not found.enforced and found.note.startswith("none: ")
    assert says in found.note


def test_this_hosts_answer_matches_its_cgroup_v2_controllers() -> None:
    found = probe("probe-test", mount=None)
    mount = cgroup2_mount(Path("/proc/self/mounts").read_text())
    if mount is None:
        assert "no cgroup v2 hierarchy is mounted" in found.note
        return
    have = (mount / "cgroup.controllers").read_text().split()
    if not {"cpu", "memory"} <= set(have):
        assert found.note.startswith(f"none: cgroup v2 at {mount} does not offer the")
    else:
        assert found.note == "cgroup-v2" or "not writable by the agent" in found.note
        if found.root is not None and found.root.name == "probe-test":
            found.root.rmdir()


def confined_agent(tmp_path: Path) -> tuple[Agent, Path]:
    mount = tmp_path / "cgroup"
    home = own_cgroup()
    fake_hierarchy(mount, "fleet", "fleet/node", *([home] if home else []))
    enforcement = probe("node", mount=mount)
    assert enforcement.enforced
    return Agent(tmp_path, enforcement=enforcement), mount


def test_each_job_gets_its_own_cgroup_with_its_cpus_and_memory(tmp_path: Path) -> None:
    agent, mount = confined_agent(tmp_path)

    spec, _ = agent.start("echo confined", cpus=2, memory_mb=256)
    handle = agent.executor.handles[spec.key]
    cgroup = mount / "fleet" / "node" / "1.1"
    assert handle.cgroup == str(cgroup)
    assert (cgroup / "cpu.max").read_text() == "200000 100000"
    assert (cgroup / "memory.max").read_text() == str(256 * 1024 * 1024)
    # The shim joined the job's cgroup before starting it, then went back to its own.
    assert (cgroup / "cgroup.procs").read_text() == str(handle.shim_pid)
    home = mount / own_cgroup() / "cgroup.procs"
    assert home.read_text() == str(handle.shim_pid)
    assert agent.wait_final()["state"] == "succeeded"


def test_a_job_that_asks_for_no_cpus_or_memory_gets_no_limit(tmp_path: Path) -> None:
    agent, mount = confined_agent(tmp_path)
    agent.start("true")
    cgroup = mount / "fleet" / "node" / "1.1"
    assert (cgroup / "cpu.max").read_text() == "max 100000"
    assert (cgroup / "memory.max").read_text() == "max"
    assert agent.wait_final()["state"] == "succeeded"


def test_a_job_the_kernel_killed_at_its_memory_limit_is_reported_so(tmp_path: Path) -> None:
    agent, mount = confined_agent(tmp_path)
    # The kernel counts the kill in memory.events; here the test writes what it would.
    spec, _ = agent.start("sleep 0.3; kill -9 $$", memory_mb=512)
    cgroup = Path(agent.executor.handles[spec.key].cgroup or "")
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")

    event = agent.wait_final()

    assert event["state"] == "failed"
    assert event["reason"] == (
        "killed by signal SIGKILL: it went past its memory limit of 512 MB and the kernel killed it"
    )


def test_a_job_that_fails_on_its_own_is_not_blamed_on_memory(tmp_path: Path) -> None:
    agent, mount = confined_agent(tmp_path)
    spec, _ = agent.start("exit 3", memory_mb=512)
    assert agent.wait_final()["reason"] == "exited with code 3"


def test_a_job_whose_cgroup_cannot_be_joined_does_not_start(tmp_path: Path) -> None:
    agent, mount = confined_agent(tmp_path)
    procs = mount / "fleet" / "node" / "1.1" / "cgroup.procs"
    procs.mkdir(parents=True)  # writing to it fails, as a cgroup the agent may not use would
    marker = tmp_path / "ran"

    with pytest.raises(ExecutorError, match="cannot join its cgroup"):
        agent.start(f"touch {marker}")
    assert not marker.exists() and not agent.executor.handles


def test_the_kernel_kills_a_job_past_its_memory_limit(tmp_path: Path) -> None:
    enforcement = probe(f"test-{os.getpid()}", mount=None)
    if not enforcement.enforced:
        pytest.skip(f"this host cannot confine jobs: {enforcement.note}")
    assert enforcement.root is not None
    agent = Agent(tmp_path, enforcement=enforcement)
    try:
        grab = "python3 -c 'b = bytearray(400 << 20); print(len(b))'"
        spec, _ = agent.start(grab, memory_mb=64, cpus=1)
        cgroup = Path(agent.executor.handles[spec.key].cgroup or "")
        assert (cgroup / "memory.max").read_text().strip() == str(64 << 20)
        event = agent.wait_final()
        assert event["state"] == "failed"
        assert "past its memory limit of 64 MB" in event["reason"], event
        wait_for(lambda: not cgroup.exists(), "the job's cgroup to be removed")
    finally:
        enforcement.root.rmdir()
