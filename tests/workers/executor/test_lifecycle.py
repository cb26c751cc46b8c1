import os
import signal
import time

import psutil
import pytest

from tests.workers.executor.helpers import (
    Agent,
    FakeClock,
    group_gone,
    log_text,
    wait_for,
    wait_members,
)
from workers.executor import ExecutorError, LeaseExpired, read_log


def test_exit_zero_succeeds_with_output_in_the_log(tmp_path):
    agent = Agent(tmp_path)
    spec, pid = agent.start("echo hello from the job; echo to stderr >&2")

    event = agent.wait_final()

    assert agent.events[0]["state"] == "running" and agent.events[0]["pid"] == pid
    assert (event["state"], event["exit_code"], event["pid"]) == ("succeeded", 0, pid)
    assert log_text(spec) == "hello from the job\nto stderr\n"


def test_nonzero_exit_fails_with_the_exit_code(tmp_path):
    agent = Agent(tmp_path)
    agent.start("exit 3")

    event = agent.wait_final()

    assert (event["state"], event["exit_code"], event["reason"]) == (
        "failed",
        3,
        "exited with code 3",
    )


def test_killed_by_a_signal_fails_naming_the_signal(tmp_path):
    agent = Agent(tmp_path)
    agent.start("kill -KILL $$")

    event = agent.wait_final()

    assert (event["state"], event["exit_code"]) == ("failed", None)
    assert event["reason"] == "killed by signal SIGKILL"


def test_processes_left_behind_by_a_finished_job_are_killed(tmp_path):
    agent = Agent(tmp_path)
    _, pid = agent.start("sleep 100 & echo $! > bg.pid; exit 0", workdir=str(tmp_path))
    pid_file = tmp_path / "bg.pid"
    background = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "pid"))

    event = agent.wait_final()

    assert event["state"] == "succeeded"
    assert group_gone(pid)
    assert not psutil.pid_exists(background)


def test_time_limit_stops_the_whole_group_within_the_grace(tmp_path):
    agent = Agent(tmp_path)
    _, pid = agent.start("sleep 30", time_limit=0.2, grace=0.5)

    event = agent.wait_final()

    assert event["state"] == "timeout"
    assert event["reason"] == "exceeded its time limit of 0.2 s"
    assert event["at"] - agent.events[0]["at"] < 0.2 + 0.5 + 0.5
    assert group_gone(pid)


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    clock = FakeClock()
    agent = Agent(tmp_path, clock=clock)
    spec, pid = agent.start("trap '' TERM; echo ready; sleep 30", time_limit=60, grace=5)
    wait_for(lambda: "ready" in log_text(spec), "the trap")

    clock.now += 61  # past the limit: SIGTERM, which the job ignores
    agent.supervisor.poll()
    agent.supervisor.poll()
    assert agent.final() is None and not group_gone(pid)

    clock.now += 5  # past the grace: SIGKILL
    event = agent.wait_final()

    assert event["state"] == "timeout"
    assert group_gone(pid)


def test_cancel_kills_children_and_grandchildren(tmp_path):
    agent = Agent(tmp_path)
    _, pid = agent.start("sh -c 'sleep 100 & sleep 100' & sleep 100")
    pids = wait_members(pid, 4)

    assert agent.supervisor.cancel(1, 1, grace=0.5)
    event = agent.wait_final()

    assert event["state"] == "cancelled"
    assert group_gone(pid)
    assert not [p for p in pids if psutil.pid_exists(p)]
    assert agent.supervisor.cancel(1, 1) is False  # already over: nothing to do


def test_preempt_sends_sigterm_and_the_job_knows_its_grace(tmp_path):
    agent = Agent(tmp_path)
    command = (
        "trap 'echo checkpoint within $FLEET_PREEMPT_GRACE s; exit 0' TERM; "
        "echo ready; while true; do sleep 0.05; done"
    )
    spec, pid = agent.start(command, grace=0.75)
    wait_for(lambda: "ready" in log_text(spec), "the trap")

    assert agent.supervisor.preempt(1, 1)
    event = agent.wait_final()

    assert (event["state"], event["exit_code"]) == ("preempted", 0)
    assert "checkpoint within 0.75 s" in log_text(spec)
    assert group_gone(pid)


def test_log_is_capped_with_one_marker_and_the_job_does_not_block(tmp_path):
    agent = Agent(tmp_path)
    spec, _ = agent.start(
        "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo tail-line", log_cap_bytes=1000
    )

    event = agent.wait_final()

    text = log_text(spec)
    assert event["state"] == "succeeded"
    assert text.startswith("a" * 1000 + "\n[fleet] log truncated")
    assert text.count("[fleet] log truncated") == 1
    assert "tail-line" not in text


def test_gpu_and_fleet_variables_reach_the_job_and_cannot_be_spoofed(tmp_path):
    agent = Agent(tmp_path)
    spec, _ = agent.start(
        "env | grep -E '^(CUDA_|FLEET_|MY_VAR=)' | sort",
        job_id=42,
        attempt=3,
        gpu_indices=(1, 3),
        gpu_memory_mb=8000,
        gpu_compute_percent=50,
        grace=0.5,
        env={
            "MY_VAR": "mine",
            "FLEET_JOB_ID": "spoofed",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            "FLEET_CHECKPOINT_DIR": "/somewhere/else",
        },
    )

    agent.wait_final(42, 3)

    assert log_text(spec).splitlines() == [
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES=1,3",
        "FLEET_ATTEMPT=3",
        "FLEET_CHECKPOINT_SIGNAL=SIGTERM",
        "FLEET_GPU_COMPUTE_PERCENT=50",
        "FLEET_GPU_MEMORY_MB=8000",
        "FLEET_JOB_ID=42",
        "FLEET_PREEMPT_GRACE=0.5",
        "MY_VAR=mine",
    ]


def test_working_directory_is_used_and_a_missing_one_is_refused(tmp_path):
    agent = Agent(tmp_path)
    spec, _ = agent.start("pwd", workdir=str(tmp_path))
    agent.wait_final()
    assert log_text(spec) == f"{tmp_path}\n"

    with pytest.raises(ExecutorError, match="no/such/dir"):
        agent.start("true", job_id=2, workdir=str(tmp_path / "no/such/dir"))
    assert 2 not in [key[0] for key in agent.executor.handles]


def test_starting_the_same_attempt_twice_starts_one_process(tmp_path):
    agent = Agent(tmp_path)
    spec, pid = agent.start("sleep 30")

    again = agent.supervisor.start(spec)

    assert again == pid
    assert [e["state"] for e in agent.events] == ["running"]
    agent.supervisor.cancel(1, 1, grace=0)
    agent.wait_final()


def test_a_failed_report_is_offered_again(tmp_path):
    agent = Agent(tmp_path)
    delivered = []
    failures = [RuntimeError("broker down")]

    def report(event):
        if event["state"] != "running" and failures:
            raise failures.pop()
        delivered.append(event)

    agent.supervisor.report = report
    agent.start("exit 0")
    wait_for(lambda: agent.supervisor.poll() or failures == [], "the failed delivery")
    wait_for(lambda: agent.supervisor.poll() or len(delivered) == 2, "the retry")

    assert delivered[1]["state"] == "succeeded"
    assert agent.executor.handles == {}


def test_read_log_pages_through_and_tails(tmp_path):
    path = tmp_path / "job.log"
    path.write_bytes(b"0123456789")

    assert read_log(path, 0, 4) == (b"0123", 4)
    assert read_log(path, 4, 100) == (b"456789", 10)
    assert read_log(path, 10, 100) == (b"", 10)
    assert read_log(path, -3, 100) == (b"789", 10)
    assert read_log(tmp_path / "not-yet.log", 0, 10) == (b"", 0)


def test_pid_to_job_attributes_grandchildren_to_their_job(tmp_path):
    agent = Agent(tmp_path)
    _, pid = agent.start("sh -c 'sleep 30' & sleep 30", job_id=9)
    members = wait_members(pid, 3)

    owners = agent.supervisor.pid_to_job([*members, os.getpid()])

    assert owners == {member: 9 for member in members}
    agent.supervisor.cancel(9, 1, grace=0)
    agent.wait_final(9)


def test_signals_go_to_the_group_not_the_agent(tmp_path):
    agent = Agent(tmp_path)
    _, pid = agent.start("sleep 30")

    assert os.getpgid(pid) == pid != os.getpgid(0)
    agent.executor.signal_group((1, 1), signal.SIGKILL)
    assert agent.wait_final()["reason"] == "killed by signal SIGKILL"


def test_the_shim_starts_nothing_once_the_lease_file_says_the_lease_ran_out(tmp_path):
    """The agent checks its lease before it spawns the shim; the shim checks the lease file
    again before it runs the job, for a lease that runs out in between (a freeze)."""
    lease = tmp_path / "lease"
    lease.write_text(f"{time.time() - 1:.3f}")
    agent = Agent(tmp_path, lease_path=lease)
    marker = tmp_path / "ran"

    with pytest.raises(LeaseExpired, match="lease had run out"):
        agent.start(f"touch {marker}")

    assert agent.executor.handles == {} and agent.events == []
    time.sleep(0.3)
    assert not marker.exists()
