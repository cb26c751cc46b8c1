"""Which local account a job runs as: per-user, then per-team mapping, then the default;
never root unless the admin allows it."""

import os

import pytest

from workers.executor import ExecutorError
from workers.executor.accounts import JobAccounts, parse_user_map


def accounts(**kw):
    return JobAccounts(switch=True, **kw)


def test_the_user_map_reads_users_and_teams_and_names_a_bad_entry():
    assert parse_user_map(" team:vision=vision , user:alice=alice,") == (
        {"alice": "alice"},
        {"vision": "vision"},
    )
    for bad in ("alice=alice", "group:x=y", "team:vision", "team:=x", "user:bob="):
        with pytest.raises(ValueError, match="FLEET_JOB_USER_MAP"):
            parse_user_map(bad)


def test_from_env_reads_the_default_the_map_and_the_root_switch():
    got = JobAccounts.from_env(
        {
            "FLEET_JOB_USER": "nobody",
            "FLEET_JOB_USER_MAP": "team:vision=daemon,user:alice=bin",
            "FLEET_ALLOW_ROOT_JOBS": "1",
        }
    )
    assert (got.default, dict(got.users), dict(got.teams), got.allow_root) == (
        "nobody", {"alice": "bin"}, {"vision": "daemon"}, True,
    )  # fmt: skip
    assert JobAccounts.from_env({}).default == "fleet-job"
    assert JobAccounts.from_env({"FLEET_ALLOW_ROOT_JOBS": "yes"}).allow_root is False


def test_the_owner_mapping_wins_over_the_team_mapping_which_wins_over_the_default():
    mapping = accounts(default="nobody", users={"alice": "bin"}, teams={"vision": "daemon"})

    def uid(user, team):
        account, _ = mapping.resolve(user=user, team=team)
        return account.uid

    assert uid("alice", "vision") == 2  # bin
    assert uid("bob", "vision") == 1  # daemon
    assert uid("bob", "speech") == 65534  # nobody
    account, name = mapping.resolve(user="bob", team="vision")
    assert name == "daemon"
    assert account.environment() == {
        "HOME": "/usr/sbin", "USER": "daemon", "LOGNAME": "daemon", "SHELL": "/usr/sbin/nologin",
    }  # fmt: skip


def test_an_account_that_does_not_exist_is_refused_with_what_to_do():
    with pytest.raises(ExecutorError) as err:
        accounts(teams={"vision": "no-such-account"}).resolve(user="bob", team="vision")
    assert "'no-such-account' (from team:vision in FLEET_JOB_USER_MAP) does not exist" in str(
        err.value
    )
    assert "useradd" in str(err.value)


def test_root_is_refused_unless_the_admin_allows_it():
    with pytest.raises(ExecutorError, match="FLEET_ALLOW_ROOT_JOBS=1"):
        accounts(default="nobody", users={"alice": "root"}).resolve(user="alice", team="x")
    with pytest.raises(ExecutorError, match="would run as root"):
        accounts(default="root").resolve(user=None, team=None)
    account, _ = accounts(default="root", allow_root=True).resolve(user=None, team=None)
    assert account.uid == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs an agent that runs as root")
def test_a_root_agent_that_does_not_switch_still_refuses_to_run_jobs_as_root():
    with pytest.raises(ExecutorError, match="FLEET_ALLOW_ROOT_JOBS=1"):
        JobAccounts(switch=False).resolve(user=None, team=None)


def _start_agent(tmp_path, accounts):
    from workers.gpu import SimulatedGpuBackend
    from workers.runtime import Agent, AgentConfig

    config = AgentConfig(node="unit", state_dir=tmp_path / "state", job_accounts=accounts)
    backend = SimulatedGpuBackend("1xA100-80GB", node_name="unit")
    return Agent(config, backend=backend, send=lambda *args, **kwargs: None)


def test_the_agent_says_at_start_when_jobs_would_fail_or_are_not_isolated(tmp_path, caplog):
    _start_agent(tmp_path, accounts(default="no-such-account"))
    assert "jobs that no mapping covers will fail" in caplog.text
    assert "'no-such-account' (from FLEET_JOB_USER) does not exist" in caplog.text

    caplog.clear()
    _start_agent(tmp_path, JobAccounts(switch=False, allow_root=True))
    assert "jobs run as the agent's own account" in caplog.text
    assert "not isolated from it" in caplog.text
