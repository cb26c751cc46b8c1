"""A job cannot see fleet's secrets or act as the agent: real agent processes, started with
secrets in their environment, run jobs that look for them (see agent_harness)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.models import Job, Node
from tests.factories import JobFactory
from tests.workers.agent_harness import AgentProcess, ControlPump, dispatch
from tests.workers.conftest import StartAgent

pytestmark = pytest.mark.django_db

as_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="running jobs as another account needs an agent that runs as root (CI runs as root)",
)
SECRETS = {
    "DATABASE_URL": "postgres://fleet:db-password-4711@db/fleet",
    "SECRET_KEY": "django-secret-key-4711",
    "FLEET_SECRET_EXAMPLE": "fleet-setting-secret-4711",
}


@pytest.fixture
def host() -> Iterator[Path]:
    """Where the agent keeps its state and its jobs' scratch directories: a folder every
    account can pass through, as /var/lib is on a real host (pytest's tmp_path is private
    to the test's account, which would hide whether fleet protects its own files)."""
    path = Path(tempfile.mkdtemp(prefix="fleet-isolation-"))
    path.chmod(0o711)
    yield path
    for record in path.glob("state/attempts/*/record.json"):
        try:
            os.killpg(json.loads(record.read_text())["pid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    shutil.rmtree(path, ignore_errors=True)


def agent_env(host: Path, **extra: str) -> dict[str, str]:
    return {
        **SECRETS,
        "FLEET_AGENT_STATE_DIR": str(host / "state"),
        "FLEET_JOB_SCRATCH_DIR": str(host / "scratch"),
        **extra,
    }


def ended(job: Any) -> Callable[[], Job | None]:
    def check() -> Job | None:
        current = Job.objects.get(pk=job.pk)
        return current if current.state in ("succeeded", "failed") else None

    return check


def run(control: ControlPump, job: Any, node: Node, gpu: int = 0) -> Job:
    dispatch(control, job, node, (gpu,))
    return control.pump(ended(job), what=f"job {job.pk} to end")  # type: ignore[no-any-return]


def output(control: ControlPump, api: Any, job: Any) -> str:
    def complete() -> Any:
        body = api.get(f"/api/v1/jobs/{job.pk}/logs/").json()
        return body if body["complete"] else None

    return str(control.pump(complete, what=f"job {job.pk}'s log")["data"])


def test_a_job_sees_its_own_variables_and_none_of_the_agents_secrets(
    agents: StartAgent, control: ControlPump, host: Path, owner: Any, owner_api: Any, team: Any
) -> None:
    node, agent = agents(env=agent_env(host))
    secrets = {**SECRETS, "REDIS_URL": agent_broker(agent), "FLEET_NODE_KEY": node_key(agent)}
    job = JobFactory(
        owner=owner,
        team=team,
        env={"MY_SETTING": "mine", "FLEET_SIM_UTIL": "30"},
        # Its own environment, and its parent's (the launcher), where it may read it.
        command="tr '\\0' '\\n' < /proc/self/environ; echo ---; "
        "tr '\\0' '\\n' < /proc/$PPID/environ 2>&1 || true",
    )

    done = run(control, job, node)

    assert done.state == "succeeded", done.state_reason
    own, _, parent = output(control, owner_api, job).partition("---\n")
    env = dict(line.split("=", 1) for line in own.splitlines() if "=" in line)
    assert env["MY_SETTING"] == "mine" and env["FLEET_SIM_UTIL"] == "30"
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["FLEET_JOB_ID"] == str(job.pk)
    for name, value in secrets.items():
        assert name not in env
        assert value not in own and value not in parent, f"{name} reached the job"
    assert {"CELERY_BROKER_URL", "FLEET_CONTROL_QUEUE", "FLEET_AGENT_STATE_DIR"}.isdisjoint(env)


def agent_broker(agent: AgentProcess) -> str:
    return environ_of(agent)["REDIS_URL"]


def node_key(agent: AgentProcess) -> str:
    return environ_of(agent)["FLEET_NODE_KEY"]


def environ_of(agent: AgentProcess) -> dict[str, str]:
    raw = Path(f"/proc/{agent.proc.pid}/environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


@as_root
def test_a_job_runs_as_its_account_and_cannot_read_the_agent_or_other_jobs(
    agents: StartAgent,
    control: ControlPump,
    host: Path,
    owner: Any,
    owner_api: Any,
    teammate: Any,
    team: Any,
) -> None:
    node, agent = agents(
        env=agent_env(host, FLEET_JOB_USER="nobody", FLEET_JOB_USER_MAP="user:teammate=root")
    )
    first = JobFactory(owner=owner, team=team, command="echo output of the first job")
    assert run(control, first, node).state == "succeeded"
    state = host / "state"
    (first_log,) = (state / "logs").glob(f"{first.pk}.*.log")

    def attempt(what: str, command: str) -> str:
        return f"if {command} >/dev/null 2>&1; then echo '{what}: read'; else echo '{what}: denied'; fi"

    prying = JobFactory(
        owner=owner,
        team=team,
        command="; ".join(
            [
                "id -u",
                attempt("state dir", f"ls {state}"),
                attempt("started list", f"cat {state}/started"),
                attempt("agent environ", f"cat /proc/{agent.proc.pid}/environ"),
                attempt("log of the first job", f"cat {first_log}"),
                attempt("own scratch dir", "touch ./written"),
            ]
        ),
    )
    assert run(control, prying, node).state == "succeeded"
    assert output(control, owner_api, prying).splitlines() == [
        str(pwd.getpwnam("nobody").pw_uid),
        "state dir: denied",
        "started list: denied",
        "agent environ: denied",
        "log of the first job: denied",
        "own scratch dir: read",
    ]

    as_root = JobFactory(owner=teammate, team=team, command=f"touch {host}/root-was-here")
    done = run(control, as_root, node)
    assert done.state == "failed"
    assert "would run as root" in done.state_reason
    assert "FLEET_ALLOW_ROOT_JOBS=1" in done.state_reason
    assert not (host / "root-was-here").exists()

    private = JobFactory(owner=owner, team=team, command="ls", workdir="/root")
    done = run(control, private, node)
    assert done.state == "failed"
    assert "account nobody cannot enter its working directory /root" in done.state_reason


@as_root
def test_the_owner_and_team_mapping_picks_the_account(
    agents: StartAgent,
    control: ControlPump,
    host: Path,
    owner: Any,
    owner_api: Any,
    teammate: Any,
    teammate_api: Any,
    outsider: Any,
    outsider_api: Any,
    team: Any,
    other_team: Any,
) -> None:
    node, _ = agents(
        simulate="3xA100-80GB",
        env=agent_env(
            host, FLEET_JOB_USER="nobody", FLEET_JOB_USER_MAP="user:owner=daemon,team:speech=bin"
        ),
    )
    jobs = [
        (JobFactory(owner=owner, team=team, command="id -un"), owner_api, "daemon"),
        (JobFactory(owner=teammate, team=team, command="id -un"), teammate_api, "nobody"),
        (JobFactory(owner=outsider, team=other_team, command="id -un"), outsider_api, "bin"),
    ]
    for gpu, (job, _, _) in enumerate(jobs):
        dispatch(control, job, node, (gpu,))

    for job, api, account in jobs:
        assert control.pump(ended(job), what=f"job {job.pk} to end").state == "succeeded"
        assert output(control, api, job) == f"{account}\n"
