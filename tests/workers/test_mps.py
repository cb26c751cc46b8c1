"""Fractional GPU jobs and CUDA MPS.

This machine has no GPU and runs no MPS daemon, so a temporary directory with a `control`
named pipe stands in for the daemon's pipe directory: the tests check what the agent finds
there and which variables a job's process gets, not that a GPU honours them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.workers.executor.helpers import Agent, log_text
from workers.executor import JobSpec, job_environment
from workers.executor.mps import (
    MAX_ENFORCEMENT_CHARS,
    MPS_VARIABLES,
    Mps,
    mps_environment,
    mps_probe,
    with_mps,
)


@pytest.fixture
def pipe_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "nvidia-mps"
    directory.mkdir()
    os.mkfifo(directory / "control")
    return directory


def _spec(**kw: object) -> JobSpec:
    return JobSpec(job_id=7, attempt=2, command="true", log_path="/dev/null", **kw)  # type: ignore[arg-type]


def _host(pipe_dir: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir),
        "CUDA_MPS_LOG_DIRECTORY": "/var/log/mps-test",
    }


def test_a_fraction_on_an_mps_host_gets_its_share(pipe_dir: Path) -> None:
    fraction = _spec(gpu_indices=(3,), gpu_memory_mb=20000, gpu_compute_percent=25)
    env = job_environment(fraction, _host(pipe_dir))
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    # The job sees only its GPU, which is CUDA device 0 to it.
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20000M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe_dir)
    assert env["CUDA_MPS_LOG_DIRECTORY"] == "/var/log/mps-test"


def test_a_memory_only_fraction_gets_no_compute_limit(pipe_dir: Path) -> None:
    env = job_environment(_spec(gpu_indices=(0,), gpu_memory_mb=8000), _host(pipe_dir))
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8000M"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_the_jobs_own_values_cannot_widen_its_share(pipe_dir: Path) -> None:
    own = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}
    fraction = _spec(gpu_indices=(1,), gpu_memory_mb=4000, gpu_compute_percent=10, env=own)
    env = job_environment(fraction, _host(pipe_dir))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4000M"


def test_whole_gpu_jobs_get_no_mps_variables(pipe_dir: Path) -> None:
    for indices in ((0,), (0, 1), ()):
        env = job_environment(_spec(gpu_indices=indices), _host(pipe_dir))
        assert not set(MPS_VARIABLES) & set(env), indices


def test_a_host_without_mps_sets_nothing_and_says_why(tmp_path: Path) -> None:
    fraction = _spec(gpu_indices=(0,), gpu_memory_mb=8000, gpu_compute_percent=50)
    missing = tmp_path / "absent"
    env = job_environment(fraction, {"CUDA_MPS_PIPE_DIRECTORY": str(missing)})
    assert not set(MPS_VARIABLES) & set(env)
    assert env["FLEET_GPU_MEMORY_MB"] == "8000"  # the share is still told, as advice
    mps = mps_probe({"CUDA_MPS_PIPE_DIRECTORY": str(missing)})
    assert not mps.available
    assert mps.note == (
        f"mps: none: {missing} (CUDA_MPS_PIPE_DIRECTORY) does not exist: no MPS control "
        "daemon runs on this host"
    )


def test_a_pipe_directory_without_a_running_daemon_is_not_mps(tmp_path: Path) -> None:
    # The daemon leaves its directory behind when it quits; the control pipe goes with it.
    left = tmp_path / "nvidia-mps"
    left.mkdir()
    mps = mps_probe({"CUDA_MPS_PIPE_DIRECTORY": str(left)})
    assert not mps.available and "has no control pipe" in mps.reason
    (left / "control").write_text("not a pipe")
    mps = mps_probe({"CUDA_MPS_PIPE_DIRECTORY": str(left)})
    assert not mps.available and "is not a named pipe" in mps.reason
    fraction = _spec(gpu_indices=(0,), gpu_compute_percent=50)
    assert mps_environment(fraction, mps) == {}


def test_the_probe_reports_the_pipe_directory(pipe_dir: Path) -> None:
    mps = mps_probe({"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)})
    assert mps.available and mps.note == f"mps: {pipe_dir}"
    # Without the variable the default directory is the one looked at.
    assert "/tmp/nvidia-mps" in mps_probe({}).note


def test_a_real_fraction_process_sees_the_variables(tmp_path: Path, pipe_dir: Path) -> None:
    agent = Agent(tmp_path, base_env={**os.environ, **_host(pipe_dir)})
    spec, _ = agent.start(
        "env | grep ^CUDA_MPS_ | sort",
        gpu_indices=(0,),
        gpu_memory_mb=6000,
        gpu_compute_percent=30,
    )
    assert agent.wait_final()["state"] == "succeeded"
    assert log_text(spec).split() == [
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
        "CUDA_MPS_LOG_DIRECTORY=/var/log/mps-test",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=6000M",
        f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}",
    ]


@pytest.mark.django_db
def test_the_job_page_says_whether_a_fractions_share_is_enforced(
    owner: object, team: object, pipe_dir: Path
) -> None:
    from django.test import Client

    from fleet.models import Node
    from tests.factories import JobFactory, NodeFactory

    client = Client()
    client.force_login(owner)  # type: ignore[arg-type]
    node: Any = NodeFactory(name="gpu-1")
    fraction: Any = JobFactory(
        owner=owner, team=team, gpus=0, gpu_memory_mb=8000, gpu_compute_percent=50, node=node
    )
    whole: Any = JobFactory(owner=owner, team=team, gpus=1, node=node)
    for note, word in (
        (with_mps("cgroup-v2", mps_probe({"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)})), "enforced"),
        (with_mps("cgroup-v2", mps_probe({"CUDA_MPS_PIPE_DIRECTORY": "/nonexistent"})), "advisory"),
        ("none: no cgroup v2", "advisory"),  # an agent from before the "mps:" part
    ):
        Node.objects.filter(pk=node.pk).update(resource_enforcement=note)
        html = client.get(f"/jobs/{fraction.pk}/").content.decode()
        assert f"<dt>Share</dt><dd>{word}: gpu-1" in html, note
        assert "<dt>Share</dt>" not in client.get(f"/jobs/{whole.pk}/").content.decode()
        # The node page still reads the cgroup part of the string.
        node_html = client.get("/nodes/gpu-1/").content.decode()
        held = "each job is held to its CPUs and memory" in node_html
        assert held == note.startswith("cgroup-v2"), note


def test_the_enforcement_string_stays_within_what_the_control_side_stores() -> None:
    long_reason = Mps(None, reason="x" * 400)
    note = with_mps("none: " + "y" * 200, long_reason)
    assert len(note) == MAX_ENFORCEMENT_CHARS and note.endswith("…")
    assert with_mps("cgroup-v2", Mps("/tmp/nvidia-mps")) == "cgroup-v2; mps: /tmp/nvidia-mps"
