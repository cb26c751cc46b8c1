"""Two members of one job on two real agents meet over TCP, the way torch.distributed's TCP
rendezvous does: rank 0 listens on MASTER_ADDR:MASTER_PORT, rank 1 connects, and each tells
the other its rank and WORLD_SIZE. The starts go through the broker, signed, one per node,
with the rendezvous the control side sends; the agents' reports are read, not applied, so
the control side's own placement of gangs is not what is tested here."""

from __future__ import annotations

import base64
import socket
from pathlib import Path
from typing import Any

import pytest

from fleet.services import messaging
from fleet.services.job_states import SCHEDULER, job_transition
from tests.factories import JobFactory
from tests.workers.agent_harness import AgentProcess, ControlPump
from tests.workers.conftest import StartAgent

pytestmark = pytest.mark.django_db

# Standard library only, run by the system's python3 as the job's account.
MEMBER = r"""
import os, socket, sys, time
rank, world = int(os.environ["NODE_RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
mine = "rank=%d world_size=%d nnodes=%s local_world_size=%s nodelist=%s" % (
    rank, world, os.environ["FLEET_NNODES"], os.environ["LOCAL_WORLD_SIZE"],
    os.environ["FLEET_NODELIST"])
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(30)
    conn, _ = server.accept()
else:
    deadline = time.time() + 30
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
conn.settimeout(30)
conn.sendall((mine + "\n").encode())
peer = conn.makefile().readline().strip()
print("self: " + mine)
print("peer: " + peer)
peer_rank = int(peer.split()[0].split("=")[1])
sys.exit(0 if peer_rank == 1 - rank and ("world_size=%d" % world) in peer else 1)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def member_log(agent: AgentProcess, job_id: int) -> str:
    logs = sorted((agent.state_dir / "logs").glob(f"{job_id}.1*.log"))
    return logs[0].read_text() if logs else ""


def test_two_members_on_two_agents_meet_over_tcp_and_both_exit_0(
    agents: StartAgent, control: ControlPump, owner: Any, team: Any
) -> None:
    (node_a, agent_a), (node_b, agent_b) = agents("4xA100-80GB"), agents("4xA100-80GB")
    program = base64.b64encode(MEMBER.encode()).decode()
    command = f"/usr/bin/python3 -c \"import base64; exec(base64.b64decode('{program}'))\""
    job = JobFactory(owner=owner, team=team, command=command)
    port = free_port()

    def go() -> None:
        job_transition(job_id=job.pk, action="dispatch", actor=SCHEDULER,
                       fields={"node": node_a, "gpu_indices": [0, 1, 2]})  # fmt: skip
        for rank, node in enumerate((node_a, node_b)):
            spec = {
                "command": command,
                "gpu_indices": [1, 2, 3] if rank else [0, 1, 2],
                "grace": 2,
                "user": owner.username,
                "team": team.slug,
                "cpus": 2,
                "memory_mb": 1024,
                "rendezvous": {
                    "rank": rank,
                    "nnodes": 2,
                    "gpus_per_node": 3,
                    "world_size": 6,
                    "master_addr": "127.0.0.1",
                    "master_port": port,
                    "hosts": ["127.0.0.1", "127.0.0.1"],
                },
            }
            messaging.send_to_node_on_commit(
                node.name, messaging.START_JOB_TASK, job_id=job.pk, attempt=1, spec=spec
            )

    control.run(go)

    def finals() -> dict[str, dict[str, Any]] | None:
        ended = {
            node: args
            for node, args in control.opened("fleet.tasks.job_report")
            if args["job_id"] == job.pk and args["state"] not in ("running",)
        }
        return ended if len(ended) == 2 else None

    ended = control.listen(finals, timeout=60, what="both members to end")
    for node, agent in ((node_a, agent_a), (node_b, agent_b)):
        report = ended[node.name]
        log = member_log(agent, job.pk)
        assert (report["state"], report["exit_code"]) == ("succeeded", 0), (report, log)
    common = "world_size=6 nnodes=2 local_world_size=3 nodelist=127.0.0.1,127.0.0.1"
    assert member_log(agent_a, job.pk).splitlines() == [
        f"self: rank=0 {common}",
        f"peer: rank=1 {common}",
    ]
    assert member_log(agent_b, job.pk).splitlines() == [
        f"self: rank=1 {common}",
        f"peer: rank=0 {common}",
    ]
    shipped: dict[str, set[int]] = {node_a.name: set(), node_b.name: set()}
    for node_name, args in control.opened("fleet.tasks.job_log"):
        if args["job_id"] == job.pk:
            shipped[node_name].add(args["rank"])
    assert shipped == {node_a.name: {0}, node_b.name: {1}}


def test_a_member_with_a_malformed_rendezvous_is_refused_with_its_reason(
    agents: StartAgent, control: ControlPump, owner: Any, team: Any, tmp_path: Path
) -> None:
    node, agent = agents()
    job = JobFactory(owner=owner, team=team, command="echo should not run")
    bad = {"rank": 1, "nnodes": 1, "gpus_per_node": 1, "world_size": 1,
           "master_addr": "127.0.0.1", "master_port": 29500, "hosts": ["127.0.0.1"]}  # fmt: skip

    def go() -> None:
        job_transition(job_id=job.pk, action="dispatch", actor=SCHEDULER,
                       fields={"node": node, "gpu_indices": [0]})  # fmt: skip
        spec = {"command": job.command, "gpu_indices": [0], "rendezvous": bad}
        messaging.send_to_node_on_commit(
            node.name, messaging.START_JOB_TASK, job_id=job.pk, attempt=1, spec=spec
        )

    control.run(go)
    reports = control.listen(
        lambda: [a for _, a in control.opened("fleet.tasks.job_report") if a["job_id"] == job.pk],
        what="the refusal",
    )
    assert reports[0]["state"] == "failed"
    assert "rank=1; it must be a whole number from 0 to 0" in reports[0]["reason"]
    assert "rank=1; it must be a whole number from 0 to 0" in agent.output()
    assert member_log(agent, job.pk) == ""
