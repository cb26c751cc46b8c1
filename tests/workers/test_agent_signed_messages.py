"""A real agent acts only on messages the control side signed for it: an unsigned, a
wrongly signed, an expired, a misdirected and a replayed start, put straight on its queue
as any broker client could, run nothing."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.celery import app
from fleet.services import wire
from tests.workers.conftest import StartAgent
from workers.wire import Signer, key_generate

pytestmark = pytest.mark.django_db

START = "workers.tasks.start_job"


@pytest.fixture
def markers() -> Iterator[Path]:
    """A folder every job account may write to; each job appends a line to its file."""
    folder = Path("/tmp") / f"fleet-wire-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o777)
    folder.chmod(0o1777)
    yield folder
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


def start_args(job_id: int, markers: Path) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "attempt": 1,
        "spec": {
            "command": f"echo ran >> {markers}/{job_id}",
            "workdir": str(markers),
            "dispatch": f"{time.time():.6f}",
        },
    }


def put(node_name: str, kwargs: dict[str, Any]) -> None:
    app.send_task(START, kwargs=kwargs, queue=f"node.{node_name}")


def wait_for(path: Path, diagnostics: Callable[[], str], timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared; the agent said:\n{diagnostics()}")


def test_only_signed_current_unused_starts_for_this_node_run(
    agents: StartAgent, markers: Path
) -> None:
    env = {"FLEET_JOB_USER": "nobody"} if os.geteuid() == 0 else {}
    node, agent = agents(env=env)
    other, _ = agents(env=env)
    now = time.time()
    put(node.name, start_args(1, markers))  # the old shape: plain arguments, no envelope
    put(node.name, Signer(key_generate()).seal(START, node.name, start_args(2, markers), 60))
    stale = Signer(wire.control_private_key(), clock=lambda: now - 3600)
    put(node.name, stale.seal(START, node.name, start_args(3, markers), 120))
    put(
        node.name,
        wire.seal_for_node(node=other.name, task=START, args=start_args(4, markers), ttl=60),
    )
    stop = wire.seal_for_node(
        node=node.name, task="workers.tasks.stop_job", args=start_args(5, markers), ttl=60
    )
    put(node.name, stop)
    valid = wire.seal_for_node(node=node.name, task=START, args=start_args(6, markers), ttl=60)
    put(node.name, valid)

    # The queue is handled in order: once the valid start has run, the others were refused.
    assert wait_for(markers / "6", agent.output) == "ran\n"
    assert sorted(p.name for p in markers.iterdir()) == ["6"]
    log = agent.output()
    for reason in (
        "refused workers.tasks.start_job: unsigned message (no envelope)",
        "refused workers.tasks.start_job: bad signature",
        "refused workers.tasks.start_job: expired",
        f"refused workers.tasks.start_job: signed for node '{other.name}'",
        "refused workers.tasks.start_job: signed for task 'workers.tasks.stop_job'",
    ):
        assert reason in log

    put(node.name, valid)  # captured from the broker and sent again
    put(
        node.name,
        wire.seal_for_node(node=node.name, task=START, args=start_args(7, markers), ttl=60),
    )
    assert wait_for(markers / "7", agent.output) == "ran\n"
    assert (markers / "6").read_text() == "ran\n"
    assert "refused workers.tasks.start_job: replayed message" in agent.output()
