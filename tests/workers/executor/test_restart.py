"""An agent process that restarts finds the attempts its predecessor started."""

from pathlib import Path

from tests.workers.executor.helpers import Agent, group_gone, log_text, wait_for


def test_running_attempts_survive_a_restart_and_unknown_ones_are_stopped(tmp_path):
    old = Agent(tmp_path)
    keep_spec, keep_pid = old.start("echo started; sleep 30; echo still writing", job_id=1)
    _, drop_pid = old.start("sleep 30", job_id=2)
    wait_for(lambda: "started" in log_text(keep_spec), "output from the job")

    new = Agent(tmp_path)  # same state directory, fresh process state

    assert sorted(new.supervisor.running()) == [(1, 1, keep_pid), (2, 1, drop_pid)]
    assert new.supervisor.stop_unknown({(1, 1)}) == [(2, 1)]
    event = new.wait_final(2)
    assert (event["state"], event["reason"]) == (
        "cancelled",
        "this node is no longer assigned the attempt",
    )
    assert group_gone(drop_pid)
    assert new.supervisor.running() == [(1, 1, keep_pid)]

    new.supervisor.cancel(1, 1, grace=0)
    assert new.wait_final(1)["state"] == "cancelled"


def test_an_attempt_that_ended_while_the_agent_was_away_is_reported(tmp_path):
    old = Agent(tmp_path)
    old.start("exit 5", job_id=7)
    wait_for(lambda: old.executor.exit_status((7, 1)) is not None, "the job to end")

    new = Agent(tmp_path)

    assert new.supervisor.running() == []
    event = new.wait_final(7)
    assert (event["state"], event["exit_code"]) == ("failed", 5)
    assert not any(Path(tmp_path / "state").iterdir())


def test_the_time_limit_still_holds_after_a_restart(tmp_path):
    old = Agent(tmp_path)
    _, pid = old.start("sleep 30", time_limit=0.3, grace=0.3)

    new = Agent(tmp_path)
    event = new.wait_final()

    assert event["state"] == "timeout"
    assert group_gone(pid)


def _as_if_the_agent_died_before_hearing_the_pid(tmp_path, job_id):
    import json

    record_path = next(Path(tmp_path / "state").glob(f"{job_id}.1/record.json"))
    record = json.loads(record_path.read_text())
    record["pid"] = 0
    record_path.write_text(json.dumps(record))
    return record_path.parent


def test_a_job_whose_start_the_agent_did_not_live_to_hear_is_adopted(tmp_path):
    old = Agent(tmp_path)
    _, pid = old.start("sleep 30", job_id=3)
    _as_if_the_agent_died_before_hearing_the_pid(tmp_path, 3)

    new = Agent(tmp_path)

    assert new.supervisor.running() == [(3, 1, pid)]
    new.supervisor.cancel(3, 1, grace=0)
    assert new.wait_final(3)["state"] == "cancelled"
    assert group_gone(pid)


def test_an_attempt_whose_job_never_started_is_dropped(tmp_path):
    old = Agent(tmp_path)
    _, pid = old.start("sleep 30", job_id=4)
    attempt_dir = _as_if_the_agent_died_before_hearing_the_pid(tmp_path, 4)
    (attempt_dir / "job.pid").unlink()  # as if the shim died before starting the job

    new = Agent(tmp_path)

    assert new.supervisor.running() == []
    assert not attempt_dir.exists()
    old.supervisor.cancel(4, 1, grace=0)  # the job itself is the test's to clean up
