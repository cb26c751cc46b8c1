"""Jobs run as their account, in a directory of their own, and cannot read the agent's
files: real job processes started by the executor (as root where the test needs to switch
accounts)."""

import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from tests.workers.executor.helpers import Agent, log_text
from workers.executor import ExecutorError
from workers.executor.accounts import JobAccounts

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="switching a job's account needs the agent to run as root"
)
NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def host():
    """The agent's directories in a place every account can pass through, as on a real
    host (pytest's tmp_path is private to root, which would hide what fleet itself does)."""
    path = Path(tempfile.mkdtemp(prefix="fleet-run-as-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path)


def nobody_agent(host, **accounts):
    accounts.setdefault("default", "nobody")
    return Agent(host, accounts=JobAccounts(**accounts))


def test_the_launcher_does_not_carry_the_agents_environment(tmp_path):
    """The shim is the job's parent; where the job runs as the agent's account it could
    read the shim's /proc/<pid>/environ, so the shim gets the allow-listed part only."""
    agent_env = {"PATH": os.environ["PATH"], "FLEET_NODE_KEY": "node-key", "REDIS_URL": "r"}
    agent = Agent(tmp_path, base_env=agent_env)
    agent.start("sleep 30")
    handle = agent.executor.handles[(1, 1)]

    shim_env = Path(f"/proc/{handle.shim_pid}/environ").read_bytes().split(b"\0")

    assert [v for v in shim_env if v] == [f"PATH={os.environ['PATH']}".encode()]


@as_root
def test_a_job_runs_as_its_account_in_a_fresh_private_directory_removed_after_it(host):
    agent = nobody_agent(host)
    spec, _ = agent.start('id -u; id -g; echo "$HOME $USER"; pwd; stat -c "%U %a" .')
    assert agent.wait_final()["state"] == "succeeded"

    uid, gid, identity, workdir, owner_mode = log_text(spec).splitlines()
    assert (int(uid), int(gid)) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert identity == f"{NOBODY.pw_dir} nobody"
    assert Path(workdir).parent == host / "scratch"
    assert owner_mode == "nobody 700"
    assert stat.S_IMODE((host / "scratch").stat().st_mode) == 0o711
    assert not Path(workdir).exists()  # the attempt is over and forgotten


@as_root
def test_the_agents_state_and_the_jobs_log_are_private_to_the_agent(host):
    agent = nobody_agent(host)
    state = host / "state"
    spec, _ = agent.start(
        f"ls {state} && echo LISTED; cat {state}/*/record.json && echo READ; echo done"
    )
    attempt_dir = Path(agent.executor.handles[(1, 1)].attempt_dir)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE(attempt_dir.stat().st_mode) == 0o700
    agent.wait_final()

    text = log_text(spec)
    assert "Permission denied" in text and "LISTED" not in text and "READ" not in text
    assert stat.S_IMODE(Path(spec.log_path).stat().st_mode) == 0o600


@as_root
def test_a_workdir_the_account_cannot_enter_is_refused_with_the_reason(host):
    private = host / "private"
    private.mkdir(mode=0o700)
    agent = nobody_agent(host)

    with pytest.raises(ExecutorError) as err:
        agent.start("touch pwned", workdir=str(private))

    assert f"account nobody cannot enter its working directory {private}" in str(err.value)
    assert "Permission denied" in str(err.value)
    assert agent.executor.handles == {} and not (private / "pwned").exists()


@as_root
def test_a_workdir_the_account_can_enter_is_used(host):
    shared = host / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    agent = nobody_agent(host)
    spec, _ = agent.start("pwd; touch out", workdir=str(shared))
    assert agent.wait_final()["state"] == "succeeded"
    assert log_text(spec) == f"{shared}\n"
    assert (shared / "out").stat().st_uid == NOBODY.pw_uid


@as_root
def test_a_job_mapped_to_root_or_to_a_missing_account_does_not_start(host):
    agent = nobody_agent(host, teams={"ops": "root", "ghosts": "no-such-user"})

    with pytest.raises(ExecutorError, match="would run as root.*FLEET_ALLOW_ROOT_JOBS=1"):
        agent.start("touch /root-was-here", team="ops")
    with pytest.raises(ExecutorError, match="'no-such-user' .* does not exist"):
        agent.start("true", job_id=2, team="ghosts")

    assert agent.executor.handles == {}
    assert not Path("/root-was-here").exists()
    assert not any((host / "scratch").glob("*"))


def test_state_and_logs_folders_that_existed_world_readable_are_made_private(tmp_path):
    from workers.gpu import SimulatedGpuBackend
    from workers.runtime import Agent as Runtime
    from workers.runtime import AgentConfig

    state = tmp_path / "agent"
    for folder in (state, state / "logs", state / "attempts"):
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)  # as an older agent left them

    Runtime(
        AgentConfig(node="unit", state_dir=state, job_accounts=JobAccounts.own()),
        backend=SimulatedGpuBackend("1xA100-80GB", node_name="unit"),
        send=lambda *args, **kwargs: None,
    )

    for folder in (state, state / "logs", state / "attempts"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
