"""What a job's process inherits from the agent: an allow-list, never fleet's secrets."""

from workers.executor import JobSpec, job_environment
from workers.executor.accounts import Account

AGENT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    "CUDA_HOME": "/usr/local/cuda",
    "REDIS_URL": "redis://:broker-password@redis:6379/0",
    "CELERY_BROKER_URL": "redis://:broker-password@redis:6379/0",
    "DATABASE_URL": "postgres://fleet:db-password@db/fleet",
    "SECRET_KEY": "django-secret",
    "FLEET_NODE_KEY": "node-key",
    "FLEET_SECRET_EXAMPLE": "any-fleet-setting",
    "HOME": "/root",
    "USER": "root",
    "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
    "AWS_SECRET_ACCESS_KEY": "cloud-secret",
}
NOBODY = Account(
    name="nobody", uid=65534, gid=65534, groups=(65534,), home="/nonexistent",
    shell="/usr/sbin/nologin",
)  # fmt: skip


def spec(**kw):
    return JobSpec(job_id=7, attempt=2, command="true", log_path="/dev/null", **kw)


def test_a_job_inherits_only_the_allow_list_and_runs_with_its_accounts_identity():
    env = job_environment(spec(gpu_indices=(1,)), AGENT_ENV, account=NOBODY.environment())

    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "CUDA_HOME": "/usr/local/cuda",
        "HOME": "/nonexistent",
        "USER": "nobody",
        "LOGNAME": "nobody",
        "SHELL": "/usr/sbin/nologin",
        "CUDA_VISIBLE_DEVICES": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "FLEET_JOB_ID": "7",
        "FLEET_ATTEMPT": "2",
        "FLEET_PREEMPT_GRACE": "30",
    }


def test_an_admin_widens_the_allow_list_but_never_to_fleets_secrets():
    agent_env = {**AGENT_ENV, "NCCL_SOCKET_IFNAME": "ib0", "NCCL_DEBUG": "WARN"}
    allow = ("NCCL_*", "SSH_AUTH_SOCK", "REDIS_URL", "DATABASE_URL", "SECRET_KEY", "FLEET_*")

    env = job_environment(spec(), agent_env, allow=allow)

    assert env["NCCL_SOCKET_IFNAME"] == "ib0" and env["NCCL_DEBUG"] == "WARN"
    assert env["SSH_AUTH_SOCK"] == "/tmp/ssh-agent.sock"
    for name in ("REDIS_URL", "CELERY_BROKER_URL", "DATABASE_URL", "SECRET_KEY"):
        assert name not in env
    assert sorted(k for k in env if k.startswith("FLEET_")) == [
        "FLEET_ATTEMPT", "FLEET_JOB_ID", "FLEET_PREEMPT_GRACE",
    ]  # fmt: skip


def test_the_jobs_own_variables_override_the_agents_and_fleets_override_the_jobs():
    own = {
        "PATH": "/opt/conda/bin:/usr/bin",
        "HOME": "/data/me",
        "REDIS_URL": "redis://my-own-cache:6379/0",
        "FLEET_SIM_UTIL": "40",
        "FLEET_ATTEMPT": "99",
    }

    env = job_environment(spec(env=own), AGENT_ENV, account=NOBODY.environment())

    assert env["PATH"] == "/opt/conda/bin:/usr/bin"
    assert env["HOME"] == "/data/me"
    assert env["REDIS_URL"] == "redis://my-own-cache:6379/0"  # the job's, not the agent's
    assert env["FLEET_SIM_UTIL"] == "40"
    assert env["FLEET_ATTEMPT"] == "2"


def test_the_checkpoint_directory_and_signal_are_fleets_never_the_jobs():
    own = {"FLEET_CHECKPOINT_DIR": "/elsewhere", "FLEET_CHECKPOINT_SIGNAL": "SIGHUP"}

    given = job_environment(
        spec(env=own), AGENT_ENV, checkpoint_dir="/ckpt/vision/7", stop_signal="SIGUSR1"
    )
    none = job_environment(spec(env=own), AGENT_ENV)

    assert given["FLEET_CHECKPOINT_DIR"] == "/ckpt/vision/7"
    assert given["FLEET_CHECKPOINT_SIGNAL"] == "SIGUSR1"
    assert "FLEET_CHECKPOINT_DIR" not in none and "FLEET_CHECKPOINT_SIGNAL" not in none
