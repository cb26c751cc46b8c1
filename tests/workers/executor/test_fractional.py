import pytest

from tests.workers.executor.helpers import Agent, group_gone, wait_for
from workers.executor import ExecutorError
from workers.gpu import SimulatedGpuBackend


def _agent(tmp_path):
    backend = SimulatedGpuBackend("1xA100-80GB", node_name="n1", seed=1)
    return Agent(tmp_path, gpu_backend=backend), backend


def test_a_fraction_over_its_memory_request_is_stopped_with_the_numbers(tmp_path):
    agent, backend = _agent(tmp_path)
    _, pid = agent.start(
        "sleep 30",
        gpu_indices=(0,),
        gpu_memory_mb=8000,
        gpu_compute_percent=50,
        env={"FLEET_SIM_MEMORY_MB": "12000"},
    )
    assert [tuple(p) for p in backend.sample()[0].processes] == [(pid, 12000)]

    event = agent.wait_final()

    assert event["state"] == "failed"
    assert event["reason"] == "used 12,000 MB of GPU memory; its request is 8,000 MB (+10%)"
    assert group_gone(pid)
    assert backend.sample()[0].processes == ()  # its simulated load is gone with it


def test_a_fraction_within_the_margin_keeps_running(tmp_path):
    agent, backend = _agent(tmp_path)
    agent.start(
        "sleep 30", gpu_indices=(0,), gpu_memory_mb=8000, env={"FLEET_SIM_MEMORY_MB": "8700"}
    )

    for _ in range(3):
        agent.supervisor.poll()

    assert agent.final() is None
    assert agent.supervisor.cancel(1, 1, grace=0)
    assert agent.wait_final()["state"] == "cancelled"


def test_memory_of_another_job_on_the_gpu_is_not_counted(tmp_path):
    agent, backend = _agent(tmp_path)
    agent.start("sleep 30", job_id=1, gpu_indices=(0,), env={"FLEET_SIM_MEMORY_MB": "40000"})
    agent.start(
        "sleep 30",
        job_id=2,
        gpu_indices=(0,),
        gpu_memory_mb=8000,
        env={"FLEET_SIM_MEMORY_MB": "6000"},
    )

    stopped = agent.supervisor.enforce_gpu_memory(backend.sample())

    assert stopped == []
    for job_id in (1, 2):
        agent.supervisor.cancel(job_id, 1, grace=0)
        agent.wait_final(job_id)


def test_a_bad_simulated_load_is_refused_before_anything_starts(tmp_path):
    agent, _ = _agent(tmp_path)

    with pytest.raises(ExecutorError, match="FLEET_SIM_UTIL='high' is not a number"):
        agent.start("true", gpu_indices=(0,), env={"FLEET_SIM_UTIL": "high"})

    assert agent.executor.handles == {}
    wait_for(lambda: not list((tmp_path / "state").iterdir()), "no attempt directory")
