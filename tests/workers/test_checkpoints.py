"""Checkpoint directories and the warning before a stop: real job processes, started by the
executor (and, end to end, by real agents on Redis that share a checkpoint root), that trap
the checkpoint signal, write to FLEET_CHECKPOINT_DIR and find it again on the next attempt."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from fleet.models import Job, JobEvent
from fleet.services.job_states import SCHEDULER, job_transition
from fleet.services.jobs import stop_previous_attempt
from tests.factories import JobFactory
from tests.workers.agent_harness import ControlPump, dispatch
from tests.workers.conftest import StartAgent
from tests.workers.executor.helpers import Agent, log_text
from workers.executor import ExecutorError
from workers.executor.accounts import JobAccounts
from workers.executor.checkpoints import CheckpointStore, parse_signal

NOBODY = pwd.getpwnam("nobody")
as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="making a directory for another account needs root"
)

# Trains until stopped: on the checkpoint signal it saves its step and exits; an attempt
# that finds a saved step says so and finishes. No `set -e`: the signal also ends `sleep`.
TRAIN = (
    'ck="$FLEET_CHECKPOINT_DIR/step"; '
    'if [ -f "$ck" ]; then echo "resumed at step $(cat "$ck")"; exit 0; fi; '
    'trap \'echo 7 > "$ck"; echo "saved on $FLEET_CHECKPOINT_SIGNAL within '
    "$FLEET_PREEMPT_GRACE s\"; exit 0' USR1; "
    "echo fresh; "
    "while true; do sleep 0.1; done"
)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A checkpoint root every account can pass through, as storage an admin names would be
    (pytest's tmp_path is private to root)."""
    parent = Path(tempfile.mkdtemp(prefix="fleet-ckpt-"))
    parent.chmod(0o711)
    yield parent / "checkpoints"
    shutil.rmtree(parent)


def says_fresh(path: Path) -> bool:
    """The job has set its trap (it prints "fresh" after)."""
    try:
        return "fresh" in path.read_text()
    except OSError:
        return False


def wait_until_fresh(agent: Agent, path: Path) -> None:
    deadline = time.monotonic() + 10
    while not says_fresh(path):
        agent.supervisor.poll()
        assert time.monotonic() < deadline, f"the job never started; events {agent.events}"
        time.sleep(0.02)


# -- the executor ---------------------------------------------------------------------------


def test_a_preempted_job_gets_the_checkpoint_signal_saves_and_the_next_attempt_resumes(
    tmp_path: Path, shared_root: Path
) -> None:
    store = CheckpointStore(shared_root)
    agent = Agent(tmp_path, checkpoints=store, stop_signal=signal.SIGUSR1)
    first, _ = agent.start(TRAIN, job_id=12, attempt=1, team="vision", grace=5)
    assert agent.events[-1]["resumed"] is False
    wait_until_fresh(agent, Path(first.log_path))

    assert agent.supervisor.preempt(12, 1)
    ended = agent.wait_final(12, 1)

    directory = shared_root / "vision" / "12"
    assert ended["state"] == "preempted" and ended["resumed"] is False
    assert (directory / "step").read_text() == "7\n"
    lines = log_text(first).splitlines()  # the shell may also note the signal `sleep` got
    assert (lines[0], lines[-1]) == ("fresh", "saved on SIGUSR1 within 5 s")
    assert directory.exists(), "kept after the attempt ends"

    second, _ = agent.start(TRAIN, job_id=12, attempt=2, team="vision")
    assert agent.events[-1] == {**agent.events[-1], "state": "running", "resumed": True}
    assert agent.wait_final(12, 2)["state"] == "succeeded"
    assert log_text(second) == "resumed at step 7\n"


def test_another_job_and_another_team_get_directories_of_their_own(
    tmp_path: Path, shared_root: Path
) -> None:
    agent = Agent(tmp_path, checkpoints=CheckpointStore(shared_root))
    a, _ = agent.start('echo "$FLEET_CHECKPOINT_DIR"; ls -A "$FLEET_CHECKPOINT_DIR"', job_id=1,
                       team="vision")  # fmt: skip
    agent.wait_final(1, 1)
    (shared_root / "vision" / "1" / "model.pt").write_text("weights")
    b, _ = agent.start('echo "$FLEET_CHECKPOINT_DIR"; ls -A "$FLEET_CHECKPOINT_DIR"', job_id=2,
                       team="nlp")  # fmt: skip
    agent.wait_final(2, 1)

    assert log_text(a) == f"{shared_root}/vision/1\n"
    assert log_text(b) == f"{shared_root}/nlp/2\n"  # empty: nothing of job 1
    assert agent.final(2, 1)["resumed"] is False  # type: ignore[index]


def test_a_job_that_ignores_the_checkpoint_signal_is_killed_after_its_grace(
    tmp_path: Path, shared_root: Path
) -> None:
    agent = Agent(tmp_path, checkpoints=CheckpointStore(shared_root), stop_signal=signal.SIGUSR1)
    spec, _ = agent.start(
        "trap 'echo warned' USR1; echo fresh; while true; do sleep 0.1; done", grace=0.5
    )
    wait_until_fresh(agent, Path(spec.log_path))
    agent.supervisor.preempt(1, 1)

    ended = agent.wait_final()

    assert (ended["state"], ended["exit_code"]) == ("preempted", None)  # killed, no exit
    assert log_text(spec).count("warned") == 1  # warned once, then SIGKILL


@as_root
def test_the_directory_belongs_to_the_jobs_account_and_the_root_is_not_listable(
    tmp_path: Path, shared_root: Path
) -> None:
    agent = Agent(
        tmp_path, checkpoints=CheckpointStore(shared_root), accounts=JobAccounts(default="nobody")
    )
    spec, _ = agent.start(
        'touch "$FLEET_CHECKPOINT_DIR/mine" && echo wrote; ls "$FLEET_CHECKPOINT_DIR/.." 2>/dev/null '
        "|| echo cannot list",
        team="vision",
        workdir="/",
    )
    assert agent.wait_final()["state"] == "succeeded"

    directory = shared_root / "vision" / "1"
    info = directory.stat()
    assert (info.st_uid, info.st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert stat.S_IMODE(info.st_mode) == 0o700
    assert stat.S_IMODE(shared_root.stat().st_mode) == 0o711
    assert stat.S_IMODE((shared_root / "vision").stat().st_mode) == 0o711
    assert log_text(spec).splitlines() == ["wrote", "cannot list"]


def test_a_checkpoint_root_that_cannot_be_made_refuses_the_start_with_the_reason(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    agent = Agent(tmp_path, checkpoints=CheckpointStore(blocker / "checkpoints"))

    with pytest.raises(ExecutorError, match="cannot make its checkpoint directory .*file"):
        agent.start("true")
    assert agent.executor.handles == {}


# -- retention --------------------------------------------------------------------------------


def test_sweep_removes_only_directories_unused_for_the_retention(tmp_path: Path) -> None:
    now = [1_000_000.0]
    store = CheckpointStore(tmp_path / "ck", retention_s=100, clock=lambda: now[0])
    for job_id in (1, 2, 3):
        store.prepare(team="vision", job_id=job_id, account=None)
        (store.path("vision", job_id) / "step").write_text("7")
    by_hand = tmp_path / "ck" / "vision" / "4"
    by_hand.mkdir()  # no marker: an older agent's, or made by hand
    now[0] += 60
    store.touch(team="vision", job_id=2)  # used since (a heartbeat while it ran)
    now[0] += 60

    removed = store.sweep(keep=[("vision", 3)])  # 3 runs here now

    assert removed == [store.path("vision", 1)]
    assert not store.path("vision", 1).exists()
    assert not (tmp_path / "ck" / "vision" / "1.used").exists()
    assert (store.path("vision", 2) / "step").exists()
    assert (store.path("vision", 3) / "step").exists()
    assert by_hand.exists() and (tmp_path / "ck" / "vision" / "4.used").exists()
    now[0] += 1000
    assert sorted(p.name for p in store.sweep()) == ["2", "3", "4"]


def test_retention_zero_keeps_everything(tmp_path: Path) -> None:
    now = [0.0]
    store = CheckpointStore(tmp_path / "ck", retention_s=0, clock=lambda: now[0])
    store.prepare(team="t", job_id=1, account=None)
    now[0] += 10 * 365 * 86400
    assert store.sweep() == [] and store.path("t", 1).exists()


# -- settings ---------------------------------------------------------------------------------


def test_the_checkpoint_signal_setting_takes_names_and_numbers_and_refuses_the_uncatchable():
    assert parse_signal("") is signal.SIGTERM
    assert parse_signal("SIGUSR1") is signal.SIGUSR1
    assert parse_signal("usr2") is signal.SIGUSR2
    assert parse_signal(str(int(signal.SIGINT))) is signal.SIGINT
    with pytest.raises(ValueError, match="'SIGFOO' is not a signal; give a name such as"):
        parse_signal("SIGFOO")
    with pytest.raises(ValueError, match="cannot be caught by a job"):
        parse_signal("KILL")


def test_the_agent_refuses_to_start_with_a_bad_checkpoint_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from workers.agent import _checkpoint_settings

    monkeypatch.setenv("FLEET_CHECKPOINT_SIGNAL", "SIGSTOP")
    with pytest.raises(SystemExit, match="cannot be caught"):
        _checkpoint_settings(tmp_path)
    monkeypatch.setenv("FLEET_CHECKPOINT_SIGNAL", "USR1")
    monkeypatch.setenv("FLEET_CHECKPOINT_RETENTION_DAYS", "-1")
    with pytest.raises(SystemExit, match="not a number of days of 0 or more"):
        _checkpoint_settings(tmp_path)
    monkeypatch.setenv("FLEET_CHECKPOINT_RETENTION_DAYS", "0.5")
    monkeypatch.setenv("FLEET_CHECKPOINT_ROOT", str(tmp_path / "shared"))
    settings = _checkpoint_settings(tmp_path / "state")
    assert settings["checkpoint_root"] == tmp_path / "shared"
    assert settings["checkpoint_retention_s"] == 43200
    assert settings["checkpoint_signal"] is signal.SIGUSR1


# -- real agents ------------------------------------------------------------------------------


def _job_state(job: Job, *states: str) -> Any:
    def check() -> Job | None:
        current = Job.objects.get(pk=job.pk)
        return current if current.state in states else None

    return check


@pytest.mark.django_db
def test_preempted_on_one_node_the_job_resumes_on_another_sharing_the_root(
    agents: StartAgent,
    control: ControlPump,
    owner: Any,
    owner_api: Any,
    team: Any,
    shared_root: Path,
) -> None:
    env = {"FLEET_CHECKPOINT_ROOT": str(shared_root), "FLEET_CHECKPOINT_SIGNAL": "SIGUSR1"}
    node_a, agent_a = agents(env=env)
    node_b, agent_b = agents(env=env)
    job = JobFactory(owner=owner, team=team, command=TRAIN, preemptible=True, max_requeues=3)
    saved = shared_root / team.slug / str(job.pk) / "step"

    dispatch(control, job, node_a)
    control.pump(_job_state(job, "running"), what="attempt 1 to run")
    control.pump(
        lambda: any(says_fresh(p) for p in (agent_a.state_dir / "logs").glob(f"{job.pk}.1*")),
        what="attempt 1 to set its trap",
    )
    assert JobEvent.objects.filter(job=job, attempt=1, reason="attempt 1 started fresh").exists()

    def preempt() -> None:
        stopped = job_transition(
            job_id=job.pk, action="preempt", actor=SCHEDULER, reason="reclaimed", attempt=1
        )
        stop_previous_attempt(stopped, reason="reclaimed")

    control.run(preempt)
    control.pump(saved.exists, what="the checkpoint to be written on the signal")
    assert saved.read_text() == "7\n"

    dispatch(control, Job.objects.get(pk=job.pk), node_b)
    done = control.pump(_job_state(job, "succeeded", "failed"), what="attempt 2 to end")
    assert (done.state, done.attempt) == ("succeeded", 2)
    logs = list((agent_b.state_dir / "logs").glob(f"{job.pk}.2*.log"))
    assert [p.read_text() for p in logs] == ["resumed at step 7\n"]
    start = JobEvent.objects.get(job=job, attempt=2, to_state="running")
    assert (start.actor, start.reason) == (node_b.name, "attempt 2 resumed from a checkpoint")

    detail = owner_api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["resumed"] is True
    browser = Client()
    browser.force_login(owner)
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert "attempt 2 resumed from checkpoint" in page


# -- the agent runtime (no broker) ------------------------------------------------------------


def runtime_agent(state_dir: Path, root: Path, sent: list, **config: Any) -> Any:
    from workers.gpu import SimulatedGpuBackend
    from workers.runtime import Agent as Runtime
    from workers.runtime import AgentConfig

    cfg = AgentConfig(
        node="unit",
        state_dir=state_dir,
        job_grace=1.0,
        job_accounts=JobAccounts.own(),
        checkpoint_root=root,
        checkpoint_signal=signal.SIGUSR1,
        **config,
    )
    backend = SimulatedGpuBackend("1xA100-80GB", node_name="unit", seed=3)
    return Runtime(cfg, backend=backend, send=lambda task, **kw: sent.append((task, kw)))


def test_reports_say_resumed_and_a_running_jobs_directory_is_never_swept(
    tmp_path: Path, shared_root: Path
) -> None:
    from workers.runtime import REPORT_TASK

    sent: list = []
    agent = runtime_agent(tmp_path / "state", shared_root, sent, checkpoint_retention_s=60)
    directory = shared_root / "vision" / "5"
    directory.mkdir(parents=True)
    (directory / "ckpt.pt").write_text("weights")
    agent.start_job(5, 2, {"command": "sleep 30", "team": "vision"})
    marker = shared_root / "vision" / "5.used"
    os.utime(marker, (0, 0))  # as if unused for years

    agent.heartbeat()  # a running job's directory is in use
    assert marker.stat().st_mtime > 1e9
    os.utime(marker, (0, 0))
    assert agent.checkpoint_sweep() == [] and directory.exists()  # runs here: kept
    reports = [kw for task, kw in sent if task == REPORT_TASK]
    assert [(r["state"], r.get("resumed")) for r in reports] == [("running", True)]
    agent.stop_job(5, 2)
    agent.supervisor.poll()


def test_a_lease_that_runs_out_warns_the_job_with_the_checkpoint_signal(
    tmp_path: Path, shared_root: Path
) -> None:
    sent: list = []
    agent = runtime_agent(tmp_path / "state", shared_root, sent, lease_seconds=1.0)
    agent.start_job(
        6,
        1,
        {
            "command": "trap 'echo saved > \"$FLEET_CHECKPOINT_DIR/step\"; exit 0' USR1; "
            "while true; do sleep 0.1; done"
        },
    )
    saved = shared_root / "_" / "6" / "step"  # a start without a team: "_"
    deadline = time.monotonic() + 10
    while not saved.exists():  # no acknowledgement: the shim stops the job on its own
        assert time.monotonic() < deadline, "the job was never warned"
        time.sleep(0.05)
    assert saved.read_text() == "saved\n"
