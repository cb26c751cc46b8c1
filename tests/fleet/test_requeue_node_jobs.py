"""`manage.py requeue_node_jobs`: what `make up` runs once it has stopped its agents' jobs.
The jobs on the named nodes are requeued (or failed once out of requeues) as for a lost
node; other nodes' jobs are untouched; a later report of the old attempt changes nothing."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from fleet import tasks
from fleet.models import JobState, Node
from fleet.services.agents import agent_register, node_key_create
from tests.fleet.test_agents import running_job
from workers.wire import Signer

pytestmark = pytest.mark.django_db

A100 = {"model": "A100-80GB", "memory_total_mb": 81920, "name": "Simulated A100"}


def node_with_key(name: str) -> tuple[Node, str]:
    node, key = node_key_create(name=name)
    gpus = [{"index": i, "uuid": f"{name}-G{i}", **A100} for i in range(2)]
    agent_register(node=node, backend="simulated", agent_version="1", gpus=gpus)
    return Node.objects.get(pk=node.pk), key


def test_the_named_nodes_jobs_are_requeued_and_later_reports_change_nothing(
    owner: Any, team: Any, sent: Any
) -> None:
    mine, key = node_with_key("sim-1")
    other, _ = node_with_key("sim-2")
    requeued = running_job(mine, owner, team)
    spent = running_job(mine, owner, team, max_requeues=0)
    untouched = running_job(other, owner, team)

    out = StringIO()
    call_command("requeue_node_jobs", "sim-1", "--reason", "make up was stopped", stdout=out)
    assert f"requeued or failed 2 job(s) that ran on sim-1: {requeued.pk}, {spent.pk}" in (
        out.getvalue()
    )
    requeued.refresh_from_db()
    spent.refresh_from_db()
    untouched.refresh_from_db()
    assert requeued.state == JobState.PENDING and requeued.attempt == 1
    assert "make up was stopped; requeued (1 of 3)" in requeued.state_reason
    assert spent.state == JobState.FAILED and "not requeued" in spent.state_reason
    assert untouched.state == JobState.RUNNING

    # The agent, started again, reports how the stopped attempt ended: fenced, ignored.
    args = {"job_id": requeued.pk, "attempt": 1, "state": "failed", "exit_code": -15}
    tasks.job_report.run(**Signer(key).seal("fleet.tasks.job_report", "sim-1", args, 60))
    requeued.refresh_from_db()
    assert requeued.state == JobState.PENDING

    # Run again (a second Ctrl-C, a retry): nothing is left to requeue.
    again = StringIO()
    call_command("requeue_node_jobs", "sim-1", stdout=again)
    assert again.getvalue() == ""
