"""The GPU-host agent: `python -m workers.agent --node NAME [--simulate SPEC]`.

It needs the broker (REDIS_URL or CELERY_BROKER_URL), its node key (FLEET_NODE_KEY,
FLEET_NODE_KEY_FILE or --key, printed by `manage.py add_node NAME` on the control side) and
the control side's public key (FLEET_CONTROL_PUBLIC_KEY or --control-key, printed by the
same command), never the database. It signs every message it sends with its node key and
acts only on messages the control side signed (workers.wire).
On start it registers its GPUs and the attempts it still runs (they survive agent restarts),
then consumes only `node.<NAME>` with a single-threaded Celery worker while background
threads supervise jobs and send heartbeats, telemetry and job output to the control queue.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

from workers import tasks
from workers.celery_app import broker_url, configure, control_queue, node_queue
from workers.executor.accounts import JobAccounts
from workers.executor.cgroups import probe
from workers.executor.checkpoints import DEFAULT_RETENTION_S, parse_signal
from workers.executor.mps import mps_probe, with_mps
from workers.fence import broker_client, fenced
from workers.gpu import select_backend
from workers.host import host_shape
from workers.lease import DEFAULT_LEASE_S
from workers.logship import DEFAULT_MAX_BYTES
from workers.runtime import Agent, AgentConfig
from workers.wire import (
    AGENT_MESSAGE_TTL_S,
    DEFAULT_TTL_S,
    Gate,
    NonceBook,
    Signer,
    WireError,
    public_key_load,
)

logger = logging.getLogger("workers.agent")


def _number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


def _version() -> str:
    try:
        return metadata.version("fleet")
    except metadata.PackageNotFoundError:
        return "dev"


def _job_settings() -> dict[str, Any]:
    """Who jobs run as and what they inherit: FLEET_JOB_USER, FLEET_JOB_USER_MAP,
    FLEET_ALLOW_ROOT_JOBS, FLEET_JOB_ENV_ALLOW and FLEET_JOB_SCRATCH_DIR (see
    workers.executor.accounts and .spec)."""
    try:
        accounts = JobAccounts.from_env(os.environ)
    except ValueError as exc:
        sys.exit(str(exc))
    allow = os.environ.get("FLEET_JOB_ENV_ALLOW", "")
    scratch = os.environ.get("FLEET_JOB_SCRATCH_DIR", "").strip()
    return {
        "job_accounts": accounts,
        "job_env_allow": tuple(name.strip() for name in allow.split(",") if name.strip()),
        "scratch_dir": Path(scratch).resolve() if scratch else None,
    }


def _checkpoint_settings(state_dir: Path) -> dict[str, Any]:
    """Where jobs keep checkpoints and for how long (FLEET_CHECKPOINT_ROOT, default
    `checkpoints` beside the state directory; FLEET_CHECKPOINT_RETENTION_DAYS, default 14, 0:
    forever) and the signal a stopped job gets first (FLEET_CHECKPOINT_SIGNAL, default
    SIGTERM); see workers.executor.checkpoints."""
    root = os.environ.get("FLEET_CHECKPOINT_ROOT", "").strip()
    raw_days = os.environ.get("FLEET_CHECKPOINT_RETENTION_DAYS", "").strip()
    try:
        days = float(raw_days) if raw_days else DEFAULT_RETENTION_S / 86400
        if not days >= 0:
            raise ValueError
    except ValueError:
        sys.exit(
            f"FLEET_CHECKPOINT_RETENTION_DAYS={raw_days!r} is not a number of days of 0 or "
            "more (0 keeps checkpoint directories forever)"
        )
    try:
        sig = parse_signal(os.environ.get("FLEET_CHECKPOINT_SIGNAL"))
    except ValueError as exc:
        sys.exit(str(exc))
    return {
        "checkpoint_root": Path(root).resolve() if root else state_dir.parent / "checkpoints",
        "checkpoint_retention_s": days * 86400,
        "checkpoint_signal": sig,
        "checkpoint_sweep_interval": _number("FLEET_CHECKPOINT_SWEEP_INTERVAL", 3600.0),
    }


def _host_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What the host offers jobs (FLEET_NODE_CPUS, FLEET_NODE_MEMORY_MB, FLEET_NODE_ADDRESS,
    FLEET_NODE_GROUP; see workers.host) and how jobs are confined (FLEET_CGROUP_ROOT; see
    workers.executor.cgroups)."""
    try:
        shape = host_shape(os.environ, simulated=bool(args.simulate))
    except ValueError as exc:
        sys.exit(str(exc))
    enforcement = probe(args.node, os.environ.get("FLEET_CGROUP_ROOT", "").strip() or None)
    if enforcement.enforced:
        logger.info("jobs are confined to their CPUs and memory in cgroups under %s",
                    enforcement.root)  # fmt: skip
    else:
        logger.warning("jobs are not confined to their CPUs and memory: %s",
                       enforcement.note.removeprefix("none: "))  # fmt: skip
    mps = mps_probe()
    if not mps.available:
        logger.warning("fractional GPU shares are advisory: %s", mps.reason)
    enforcement = replace(enforcement, note=with_mps(enforcement.note, mps))
    return {"host": shape, "enforcement": enforcement}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m workers.agent", description=__doc__)
    parser.add_argument("--node", default=os.environ.get("FLEET_NODE_NAME") or socket.gethostname())
    parser.add_argument(
        "--simulate",
        default=os.environ.get("FLEET_SIMULATE_GPUS") or None,
        help="simulate these GPUs instead of reading NVML, e.g. 4xA100-80GB",
    )
    parser.add_argument("--key", default=os.environ.get("FLEET_NODE_KEY", ""))
    parser.add_argument(
        "--control-key",
        default=os.environ.get("FLEET_CONTROL_PUBLIC_KEY", ""),
        help="the control side's public key (manage.py add_node prints it)",
    )
    parser.add_argument("--state-dir", default=os.environ.get("FLEET_AGENT_STATE_DIR") or None)
    parser.add_argument("--loglevel", default=os.environ.get("LOG_LEVEL", "INFO"))
    return parser.parse_args(argv)


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir or Path("var") / "agents" / args.node).resolve()


def node_key(args: argparse.Namespace) -> str:
    """The node key from --key / FLEET_NODE_KEY, or read from FLEET_NODE_KEY_FILE (a file
    readable by the agent's account only keeps the key out of the process environment)."""
    if args.key:
        return str(args.key).strip()
    path = os.environ.get("FLEET_NODE_KEY_FILE", "").strip()
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            sys.exit(f"cannot read the node key from FLEET_NODE_KEY_FILE={path}: {exc}")
    return ""


def build_gate(args: argparse.Namespace) -> Gate:
    state_dir = _state_dir(args)
    state_dir.mkdir(parents=True, exist_ok=True)
    return Gate(
        node=args.node,
        control_public_key=args.control_key,
        nonces=NonceBook(state_dir / "nonces"),
    )


def build_agent(args: argparse.Namespace) -> Agent:
    from workers.celery_app import app

    state_dir = _state_dir(args)
    config = AgentConfig(
        node=args.node,
        state_dir=state_dir,
        heartbeat_interval=_number("FLEET_HEARTBEAT_INTERVAL", 5.0),
        register_interval=_number("FLEET_REGISTER_INTERVAL", 60.0),
        telemetry_interval=_number("FLEET_TELEMETRY_INTERVAL", 5.0),
        log_interval=_number("FLEET_LOG_SHIP_INTERVAL", 2.0),
        supervise_interval=_number("FLEET_SUPERVISE_INTERVAL", 1.0),
        job_grace=_number("FLEET_JOB_GRACE", 30.0),
        log_max_bytes=int(_number("FLEET_LOG_MAX_BYTES", DEFAULT_MAX_BYTES)),
        lease_seconds=_number("FLEET_LEASE_S", DEFAULT_LEASE_S),
        version=_version(),
        **_job_settings(),
        **_host_settings(args),
        **_checkpoint_settings(state_dir),
    )
    backend = select_backend(args.simulate, node_name=args.node)
    queue = control_queue()
    lock = threading.Lock()
    signer = Signer(node_key(args))

    def send(task: str, **kwargs: Any) -> None:
        envelope = signer.seal(
            task, args.node, kwargs, AGENT_MESSAGE_TTL_S.get(task, DEFAULT_TTL_S)
        )
        with lock:  # one publisher at a time: threads and the worker share the producer
            app.send_task(
                task,
                kwargs=envelope,
                queue=queue,
                retry=True,
                retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
            )

    fences = broker_client(broker_url())
    return Agent(
        config,
        backend=backend,
        send=send,
        fence=lambda job_id, attempt, dispatch: fenced(fences, job_id, attempt, dispatch),
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args.key = node_key(args)
    if not args.key:
        sys.exit("the node key is missing: set FLEET_NODE_KEY or FLEET_NODE_KEY_FILE, or pass "
                 "--key (python manage.py add_node NAME prints it)")  # fmt: skip
    if not args.control_key:
        sys.exit("the control side's public key is missing: set FLEET_CONTROL_PUBLIC_KEY or "
                 "pass --control-key (python manage.py add_node NAME prints it)")  # fmt: skip
    try:
        public_key_load(args.control_key)
        Signer(args.key)
    except (WireError, ValueError) as exc:
        sys.exit(f"bad key: {exc}")
    app = configure(args.node)
    agent = build_agent(args)
    tasks.bind(agent, build_gate(args))
    stop = threading.Event()
    agent.run_background(stop)
    logger.info("agent %s: %d GPUs (%s), state in %s", args.node,
                len(agent.backend.inventory()), agent.backend.backend_name,
                agent.config.state_dir)  # fmt: skip
    cfg = agent.config
    logger.info("checkpoints in %s, kept %s after last use; stopped jobs get %s first",
                agent.checkpoints.root,
                f"{cfg.checkpoint_retention_s / 86400:g} days" if cfg.checkpoint_retention_s
                else "forever", cfg.checkpoint_signal.name)  # fmt: skip
    try:
        app.worker_main(
            [
                "worker",
                "--queues", node_queue(args.node),
                "--pool", "solo",
                "--hostname", f"agent-{args.node}@{socket.gethostname()}",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "--loglevel", args.loglevel.upper(),
            ]
        )  # fmt: skip
    finally:
        stop.set()  # job processes keep running: a restarted agent adopts them


if __name__ == "__main__":
    main()
