"""The agent runtime without a broker: real job processes, a recording `send`."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workers.executor.accounts import JobAccounts
from workers.gpu import SimulatedGpuBackend
from workers.logship import LogShipper, utf8_safe_end
from workers.runtime import (
    HEARTBEAT_TASK,
    LOG_TASK,
    REGISTER_TASK,
    REPORT_TASK,
    TELEMETRY_TASK,
    Agent,
    AgentConfig,
)


class Sent(list[tuple[str, dict[str, Any]]]):
    def __call__(self, task: str, **kwargs: Any) -> None:
        self.append((task, kwargs))

    def of(self, task: str) -> list[dict[str, Any]]:
        return [kw for name, kw in self if name == task]

    def reports(self) -> list[tuple[Any, int, str]]:
        return [(kw["job_id"], kw["attempt"], kw["state"]) for kw in self.of(REPORT_TASK)]


def make_agent(
    state_dir: Path, sent: Sent, spec: str = "2xA100-80GB", lease: float = 180.0, fence: Any = None
) -> Agent:
    backend = SimulatedGpuBackend(spec, node_name="unit", seed=3)
    # Not about isolation: jobs run as the test's own account (root in CI, explicitly).
    config = AgentConfig(
        node="unit",
        state_dir=state_dir,
        job_grace=1.0,
        job_accounts=JobAccounts.own(),
        lease_seconds=lease,
    )
    return Agent(config, backend=backend, send=sent, fence=fence)


def until(agent: Agent, check: Callable[[], Any], timeout: float = 8.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.supervisor.poll()
        result = check()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.fixture
def sent() -> Sent:
    return Sent()


def test_a_start_delivered_twice_starts_once_even_after_the_job_ended(
    tmp_path: Path, sent: Sent
) -> None:
    agent = make_agent(tmp_path, sent)
    spec = {"command": "echo once >> " + str(tmp_path / "runs"), "gpu_indices": [0]}
    pid = agent.start_job(7, 1, spec)
    assert agent.start_job(7, 1, spec) == pid
    until(agent, lambda: (7, 1, "succeeded") in sent.reports())
    assert agent.start_job(7, 1, spec) is None  # redelivered after the end
    restarted = make_agent(tmp_path, sent)  # and after an agent restart
    assert restarted.start_job(7, 1, spec) is None
    assert (tmp_path / "runs").read_text() == "once\n"
    assert sent.reports() == [(7, 1, "running"), (7, 1, "succeeded")]


def test_a_new_dispatch_that_reuses_a_job_id_and_attempt_starts_again(
    tmp_path: Path, sent: Sent
) -> None:
    """A control side whose database was reset numbers jobs from 1 again: its dispatch
    token differs, so the agent starts the job instead of taking it for a redelivery."""
    agent = make_agent(tmp_path, sent)
    runs = tmp_path / "runs"
    first = {"command": f"echo first >> {runs}", "dispatch": "1764486400.000001"}
    agent.start_job(3, 1, first)
    until(agent, lambda: (3, 1, "succeeded") in sent.reports())
    assert agent.start_job(3, 1, first) is None  # the same dispatch, redelivered
    restarted = make_agent(tmp_path, sent)
    second = {"command": f"echo second >> {runs}", "dispatch": "1764490000.000002"}
    assert restarted.start_job(3, 1, second) is not None
    until(restarted, lambda: sent.reports().count((3, 1, "succeeded")) == 2)
    assert runs.read_text() == "first\nsecond\n"
    # Each dispatch has its own log file: the second never appends to the first's output.
    logs = sorted((tmp_path / "logs").glob("3.1-*.log"))
    assert len(logs) == 2


def test_a_job_that_cannot_start_is_reported_failed_with_the_reason(
    tmp_path: Path, sent: Sent
) -> None:
    agent = make_agent(tmp_path, sent)
    assert agent.start_job(8, 2, {"command": "true", "workdir": "/no/such/dir"}) is None
    (report,) = sent.of(REPORT_TASK)
    assert (report["state"], report["attempt"]) == ("failed", 2)
    assert "/no/such/dir" in report["reason"]


def test_the_output_is_shipped_before_the_final_report(tmp_path: Path, sent: Sent) -> None:
    agent = make_agent(tmp_path, sent)
    agent.start_job(9, 1, {"command": "printf 'line one\\nline two\\n'; exit 4"})
    until(agent, lambda: len(sent.of(REPORT_TASK)) == 2)
    tasks = [name for name, _ in sent]
    final = len(tasks) - 1 - tasks[::-1].index(REPORT_TASK)
    chunks = sent.of(LOG_TASK)
    assert b"".join(base64.b64decode(c["data"]) for c in chunks) == b"line one\nline two\n"
    assert chunks[-1]["eof"] and tasks.index(LOG_TASK) < final
    assert sent.of(REPORT_TASK)[-1]["exit_code"] == 4


def test_registration_heartbeat_and_reconcile(tmp_path: Path, sent: Sent) -> None:
    agent = make_agent(tmp_path, sent)
    agent.register()
    (reg,) = sent.of(REGISTER_TASK)
    assert [g["uuid"] for g in reg["gpus"]] == ["SIM-unit-0", "SIM-unit-1"]
    assert reg["backend"] == "simulated" and reg["running"] == []
    pid = agent.start_job(10, 3, {"command": "sleep 30"})
    agent.heartbeat()
    assert sent.of(HEARTBEAT_TASK)[-1]["running"] == [[10, 3, pid, []]]
    # A restarted agent still knows the attempt, and reports it when it registers.
    again = make_agent(tmp_path, Sent())
    assert again.running() == [[10, 3, pid, []]]
    assert agent.reconcile([[10, 3], [11, 1]]) == [(10, 3)]
    until(agent, lambda: (10, 3, "cancelled") in sent.reports())
    assert agent.running() == []


def test_telemetry_attributes_processes_and_stops_a_fractional_job_over_its_memory(
    tmp_path: Path, sent: Sent
) -> None:
    agent = make_agent(tmp_path, sent)
    agent.start_job(
        12, 1,
        {"command": "sleep 30", "gpu_indices": [1], "gpu_memory_mb": 10000,
         "gpu_compute_percent": 25},
    )  # fmt: skip
    # The simulated backend puts FLEET_SIM_MEMORY_MB on the GPU for the job's process.
    agent.backend.unregister_job_process(agent.running()[0][2])
    agent.backend.register_job_process(
        agent.running()[0][2], [1], env={"FLEET_SIM_MEMORY_MB": "30000"}
    )
    agent.telemetry_tick()
    payload = sent.of(TELEMETRY_TASK)[0]["payload"]
    procs = payload["gpus"][1]["processes"]
    assert procs[0]["job_id"] == 12 and procs[0]["used_memory_mb"] == 30000
    assert payload["jobs"]["12"]["memory_mb"] == 30000
    report = until(
        agent, lambda: next((r for r in sent.of(REPORT_TASK) if r["state"] == "failed"), None)
    )
    assert report["reason"] == "used 30,000 MB of GPU memory; its request is 10,000 MB (+10%)"


def test_log_shipper_cuts_on_characters_caps_and_resumes(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes("abc é".encode()[:-1])  # the job has written half of "é" so far
    sent = Sent()
    shipper = LogShipper(lambda **kw: sent("log", **kw), tmp_path / "ship.json", max_bytes=10)
    shipper.watch((1, 1), str(log))
    shipper.ship()
    assert base64.b64decode(sent[-1][1]["data"]) == b"abc "  # "é" waits for its 2nd byte
    with open(log, "ab") as fh:
        fh.write("é".encode()[1:] + b"0123456789")
    resumed = LogShipper(lambda **kw: sent("log", **kw), tmp_path / "ship.json", max_bytes=10)
    resumed.watch((1, 1), str(log))
    resumed.finish((1, 1))
    data = b"".join(base64.b64decode(kw["data"]) for _, kw in sent)
    assert data == "abc é01234".encode()[:10]
    assert sent[-1][1]["eof"] and sent[-1][1]["offset"] == 10
    assert utf8_safe_end("é".encode()[:1]) == 0 and utf8_safe_end(b"ok") == 2


def test_an_outcome_is_repeated_with_every_heartbeat_until_acknowledged(
    tmp_path: Path, sent: Sent
) -> None:
    agent = make_agent(tmp_path, sent)
    agent.start_job(20, 1, {"command": "exit 0"})
    until(agent, lambda: (20, 1, "succeeded") in sent.reports())
    assert agent.running() == []
    agent.heartbeat()
    (outcome,) = sent.of(HEARTBEAT_TASK)[-1]["outcomes"]
    assert (outcome["job_id"], outcome["attempt"], outcome["state"]) == (20, 1, "succeeded")
    # The report may have been lost in the broker: a restarted agent still repeats it.
    again = make_agent(tmp_path, sent)
    again.register()
    assert [o["job_id"] for o in sent.of(REGISTER_TASK)[-1]["outcomes"]] == [20]
    again.acknowledge(time.time(), [[20, 1]])
    again.heartbeat()
    assert sent.of(HEARTBEAT_TASK)[-1]["outcomes"] == []


def test_a_job_is_stopped_as_lost_when_the_lease_runs_out_and_not_while_it_is_renewed(
    tmp_path: Path, sent: Sent
) -> None:
    agent = make_agent(tmp_path, sent, lease=1.5)
    agent.start_job(21, 1, {"command": "sleep 30"})
    # Renewed from each acknowledged heartbeat: the job runs on.
    for _ in range(12):
        agent.acknowledge(time.time())
        agent.supervisor.poll()
        time.sleep(0.25)
    assert [r[0] for r in agent.running()] == [21]
    # No word from the control side: the shim stops the job, even without the agent.
    event = until(
        agent,
        lambda: next((r for r in sent.of(REPORT_TASK) if r["state"] == "lost"), None),
        timeout=10,
    )
    assert event["job_id"] == 21 and "lease ran out" in event["reason"]
    assert agent.lease.expired()
    assert agent.acknowledge(time.time()) is None and not agent.lease.expired()


def test_a_fenced_start_never_runs(tmp_path: Path, sent: Sent) -> None:
    fences = {(22, 1, "100.000000")}
    agent = make_agent(tmp_path, sent, fence=lambda j, a, d: (j, a, d) in fences)
    marker = tmp_path / "ran"
    spec = {"command": f"touch {marker}", "dispatch": "100.000000"}
    assert agent.start_job(22, 1, spec) is None
    # The same job and attempt from another dispatch (a reset database) is not fenced.
    assert agent.start_job(22, 1, {**spec, "dispatch": "200.000000"}) is not None
    until(agent, lambda: (22, 1, "succeeded") in sent.reports())
    assert marker.exists() and sent.reports() == [(22, 1, "running"), (22, 1, "succeeded")]


def test_a_start_taken_after_the_lease_ran_out_never_runs_and_is_reported_lost(
    tmp_path: Path, sent: Sent
) -> None:
    """The agent was frozen or cut off until its lease ran out, then took a start: the
    control side may run the attempt's successor elsewhere by now, so the agent does not
    start the job (no shim is spawned) and the attempt is reported lost (requeued by the
    control side where it is still current), not failed; a redelivery never runs it."""
    agent = make_agent(tmp_path / "state", sent, lease=0.05)
    time.sleep(0.1)  # no acknowledgement since: the lease has run out
    marker = tmp_path / "ran"
    spawned: list[Any] = []
    agent.supervisor.start = spawned.append  # type: ignore[method-assign]
    assert agent.start_job(8, 1, {"command": f"touch {marker}", "gpu_indices": [0]}) is None
    assert spawned == []
    assert sent.reports() == [(8, 1, "lost")]
    assert "lease had run out before the start was taken" in sent.of(REPORT_TASK)[0]["reason"]
    # Once the control side has heard from the node again (the acknowledgement is dated
    # ten minutes on, so this short lease outlasts the job), the same start redelivered
    # still never runs, and a new attempt does.
    agent.acknowledge(time.time() + 600)
    assert agent.start_job(8, 1, {"command": f"touch {marker}", "gpu_indices": [0]}) is None
    assert spawned == [] and sent.reports() == [(8, 1, "lost")]
    del agent.supervisor.start
    assert agent.running() == [] and not marker.exists()
    agent.start_job(8, 2, {"command": f"touch {marker}", "gpu_indices": [0]})
    until(agent, lambda: (8, 2, "succeeded") in sent.reports())
    assert marker.exists()
