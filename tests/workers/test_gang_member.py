"""One member of a multi-node job on the agent: the start's rendezvous checked whole, the
environment torchrun reads, its log shipped under its rank, and the host it registers."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from tests.workers.test_agent_runtime import Sent, make_agent, until
from workers.executor import JobSpec, job_environment
from workers.executor.spec import ExecutorError, Rendezvous, spec_from_start
from workers.host import HostShape, host_cpus, host_memory_mb, host_shape
from workers.runtime import LOG_TASK, REGISTER_TASK, REPORT_TASK

RDV = {
    "rank": 1,
    "nnodes": 2,
    "gpus_per_node": 3,
    "world_size": 6,
    "master_addr": "10.0.0.5",
    "master_port": 29611,
    "hosts": ["10.0.0.5", "10.0.0.6"],
}


def start(**over: Any) -> dict[str, Any]:
    return {"command": "true", "gpu_indices": [0, 1, 2], "rendezvous": dict(RDV), **over}


def parse(spec: dict[str, Any]) -> JobSpec:
    return spec_from_start(9, 2, spec, log_path="/dev/null", default_grace=30.0)


def test_a_member_gets_the_rendezvous_variables_torchrun_reads() -> None:
    job = parse(start(cpus=8, memory_mb=32000))

    env = job_environment(job, {"PATH": "/usr/bin"})

    assert {k: env[k] for k in env if k not in ("PATH", "CUDA_DEVICE_ORDER")} == {
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29611",
        "WORLD_SIZE": "6",
        "NODE_RANK": "1",
        "LOCAL_WORLD_SIZE": "3",
        "FLEET_NNODES": "2",
        "FLEET_NODE_RANK": "1",
        "FLEET_NODELIST": "10.0.0.5,10.0.0.6",
        "CUDA_VISIBLE_DEVICES": "0,1,2",
        "FLEET_CPUS": "8",
        "FLEET_MEMORY_MB": "32000",
        "FLEET_JOB_ID": "9",
        "FLEET_ATTEMPT": "2",
        "FLEET_PREEMPT_GRACE": "30",
    }


def test_a_job_cannot_point_its_members_elsewhere() -> None:
    own = {"MASTER_ADDR": "evil.example", "MASTER_PORT": "1", "FLEET_NODELIST": "x,y"}
    env = job_environment(parse(start(env=own)), {})
    assert env["MASTER_ADDR"] == "10.0.0.5" and env["MASTER_PORT"] == "29611"
    assert env["FLEET_NODELIST"] == "10.0.0.5,10.0.0.6"


def test_a_single_node_job_and_a_fraction_are_one_member_of_rank_0() -> None:
    single = {**RDV, "rank": 0, "nnodes": 1, "gpus_per_node": 2, "world_size": 2,
              "master_addr": "127.0.0.1", "hosts": ["127.0.0.1"]}  # fmt: skip
    env = job_environment(parse(start(gpu_indices=[2, 3], rendezvous=single)), {})
    assert (env["NODE_RANK"], env["LOCAL_WORLD_SIZE"], env["WORLD_SIZE"]) == ("0", "2", "2")
    fraction = {**single, "gpus_per_node": 1, "world_size": 1}
    env = job_environment(
        parse(start(gpu_indices=[1], gpu_memory_mb=4000, rendezvous=fraction)), {}
    )
    assert (env["LOCAL_WORLD_SIZE"], env["WORLD_SIZE"], env["FLEET_NNODES"]) == ("1", "1", "1")


def test_a_start_without_a_rendezvous_keeps_the_jobs_own_master_and_no_fleet_names() -> None:
    job = parse({"command": "true", "env": {"MASTER_ADDR": "mine", "FLEET_NNODES": "9"}})
    env = job_environment(job, {})
    assert env["MASTER_ADDR"] == "mine"
    assert "FLEET_NNODES" not in env and "NODE_RANK" not in env and "FLEET_CPUS" not in env


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"rank": 2}, "rank=2; it must be a whole number from 0 to 1"),
        ({"rank": "1"}, "rank='1'"),
        ({"rank": True}, "rank=True"),
        ({"nnodes": 0}, "nnodes=0"),
        ({"master_port": 70000}, "master_port=70000; it must be a whole number from 1 to 65535"),
        ({"world_size": 5}, "world_size=5, but 2 nodes of 3 GPUs make 6"),
        ({"hosts": ["10.0.0.5"]}, "must list the 2 member nodes' addresses"),
        ({"hosts": ["10.0.0.5", "a b"]}, "'a b' is not a host name or IP address"),
        ({"hosts": ["10.0.0.7", "10.0.0.6"]}, "rank 0's host is '10.0.0.7'"),
        ({"master_addr": "10.0.0.5,x", "hosts": ["10.0.0.5,x", "y"]}, "is not a host name"),
        ({"master_port": None}, "master_port=None"),
    ],
)
def test_a_malformed_rendezvous_is_refused_naming_what_is_wrong(
    change: dict[str, Any], says: str
) -> None:
    with pytest.raises(ExecutorError) as caught:
        parse(start(rendezvous={**RDV, **change}))
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (start(rendezvous="rank 0"), "the rendezvous is str, not an object"),
        (start(rendezvous={k: v for k, v in RDV.items() if k != "rank"}), "lacks 'rank'"),
        (start(gpu_indices=[0, 1]), "gives each node 3 GPUs, but this member is assigned 2"),
        (start(cpus=-1), "cpus=-1"),
        (start(memory_mb=1.5), "memory_mb=1.5"),
        (start(gpu_indices=["0"]), "is not a list of GPU indices"),
    ],
)
def test_a_malformed_start_is_refused_naming_what_is_wrong(spec: dict[str, Any], says: str) -> None:
    with pytest.raises(ExecutorError) as caught:
        parse(spec)
    assert says in str(caught.value)


def test_an_agent_refuses_a_malformed_start_whole_and_reports_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sent = Sent()
    agent = make_agent(tmp_path, sent)
    marker = tmp_path / "ran"

    pid = agent.start_job(9, 1, start(command=f"touch {marker}", gpu_indices=[0, 1]))

    assert pid is None and not agent.executor.handles and not marker.exists()
    [report] = sent.of(REPORT_TASK)
    assert report["state"] == "failed" and report["job_id"] == 9
    assert "refused a malformed start" in report["reason"]
    assert "gives each node 3 GPUs, but this member is assigned 2" in report["reason"]
    assert "gives each node 3 GPUs" in caplog.text
    assert not list((tmp_path / "logs").iterdir())  # no log file, nothing watched


def test_a_members_output_is_shipped_under_its_rank(tmp_path: Path) -> None:
    sent = Sent()
    agent = make_agent(tmp_path, sent, spec="4xA100-80GB")
    agent.start_job(9, 1, start(command="echo rank $NODE_RANK of $FLEET_NNODES"))
    until(agent, lambda: (9, 1, "succeeded") in sent.reports())
    agent.logs.ship()

    chunks = [kw for kw in sent.of(LOG_TASK) if kw["job_id"] == 9]
    assert chunks and all(kw["rank"] == 1 for kw in chunks)
    assert chunks[-1]["eof"]
    text = b"".join(base64.b64decode(kw["data"]) for kw in chunks).decode()
    assert text == "rank 1 of 2\n"


def test_a_single_node_jobs_output_is_rank_0(tmp_path: Path) -> None:
    sent = Sent()
    agent = make_agent(tmp_path, sent)
    agent.start_job(3, 1, {"command": "echo hi", "gpu_indices": [0]})
    until(agent, lambda: (3, 1, "succeeded") in sent.reports())
    assert {kw["rank"] for kw in sent.of(LOG_TASK)} == {0}


def test_registration_reports_the_hosts_offer_and_its_enforcement(tmp_path: Path) -> None:
    sent = Sent()
    agent = make_agent(tmp_path, sent)
    object.__setattr__(agent.config, "host", HostShape(16, 64000, "10.1.2.3", "rack-a"))

    agent.register()

    [message] = sent.of(REGISTER_TASK)
    assert message["host"] == {
        "cpus": 16,
        "memory_mb": 64000,
        "address": "10.1.2.3",
        "group": "rack-a",
        "enforcement": agent.config.enforcement.note,
    }
    assert agent.config.enforcement.note.startswith("none: ")


def test_the_host_offers_what_it_has_unless_told_less() -> None:
    shape = host_shape({}, simulated=False)
    assert shape.cpus == host_cpus() >= 1 and shape.memory_mb == host_memory_mb() > 0
    assert shape.group == "" and shape.address
    less = host_shape({"FLEET_NODE_CPUS": "1", "FLEET_NODE_MEMORY_MB": "512",
                       "FLEET_NODE_GROUP": "rack-b", "FLEET_NODE_ADDRESS": "gpu7.lan"})  # fmt: skip
    assert less == HostShape(1, 512, "gpu7.lan", "rack-b")


def test_a_simulated_host_may_be_given_any_shape_and_is_reached_on_loopback() -> None:
    shape = host_shape({"FLEET_NODE_CPUS": "256", "FLEET_NODE_MEMORY_MB": "2048000"},
                       simulated=True)  # fmt: skip
    assert shape == HostShape(256, 2048000, "127.0.0.1", "")


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"FLEET_NODE_CPUS": "100000"}, "CPUs this host has; an agent may offer less"),
        ({"FLEET_NODE_CPUS": "two"}, "FLEET_NODE_CPUS='two' is not a whole number of CPUs"),
        ({"FLEET_NODE_MEMORY_MB": "0"}, "FLEET_NODE_MEMORY_MB='0' is not a whole number"),
        ({"FLEET_NODE_GROUP": "rack a"}, "FLEET_NODE_GROUP='rack a' must be at most 64"),
        ({"FLEET_NODE_ADDRESS": "10.0.0.1,10.0.0.2"}, "is not a host name or IP address"),
    ],
)
def test_a_wrong_host_setting_is_named(env: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError) as caught:
        host_shape(env, simulated=False)
    assert says in str(caught.value)


def test_an_attempt_record_keeps_its_rendezvous_across_an_agent_restart(tmp_path: Path) -> None:
    sent = Sent()
    agent = make_agent(tmp_path, sent, spec="4xA100-80GB")
    agent.start_job(9, 1, start(command="sleep 30", cpus=2, memory_mb=100))
    restarted = make_agent(tmp_path, Sent(), spec="4xA100-80GB")
    try:
        spec = restarted.executor.handles[(9, 1)].spec
        assert spec.rendezvous == Rendezvous.parse(RDV)
        assert (spec.cpus, spec.memory_mb, spec.rank) == (2, 100, 1)
    finally:
        restarted.stop_job(9, 1)
        until(restarted, lambda: not restarted.executor.handles)
