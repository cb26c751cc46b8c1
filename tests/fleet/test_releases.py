"""A stopped job's GPUs stay busy for the scheduler until its process has ended."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleet.models import GpuRelease, Job
from fleet.services import jobs as job_services
from fleet.services.agents import agent_heartbeat
from fleet.services.job_reports import job_report_apply
from fleet.services.job_states import SCHEDULER, job_transition
from fleet.services.reaper import nodes_reap
from scheduler.cycle.snapshot import build_snapshot
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _free(node_name: str, index: int) -> bool:
    core = build_snapshot(save_usage=False).core
    node = next(n for n in core.nodes if n.name == node_name)
    return next(g for g in node.gpus if g.index == index).is_whole_free


def _running(owner: Any, team: Any, node: Any, index: int) -> Job:
    job = JobFactory(owner=owner, team=team)
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [index]},
    )  # fmt: skip
    job_report_apply(node=node, job_id=job.pk, attempt=1, state="running", pid=4242)
    return Job.objects.get(pk=job.pk)


def test_cancelled_job_holds_its_gpu_until_the_agent_reports_the_end(
    owner: Any, team: Any, fleet_nodes: Any
) -> None:
    node = fleet_nodes[0]
    job = _running(owner, team, node, 2)
    assert not _free("sim-a", 2)
    job_services.job_cancel(user=owner, job=job)
    assert Job.objects.get(pk=job.pk).state == "cancelled"
    # The process is still in its grace period: the GPU is not offered to anyone.
    assert not _free("sim-a", 2)
    assert _free("sim-a", 1)
    job_report_apply(node=node, job_id=job.pk, attempt=1, state="cancelled", exit_code=-15)
    assert _free("sim-a", 2)
    assert not GpuRelease.objects.exists()


def test_requeued_job_holds_its_gpu_until_a_heartbeat_no_longer_lists_it(
    owner: Any, team: Any, fleet_nodes: Any
) -> None:
    node = fleet_nodes[0]
    job = _running(owner, team, node, 0)
    job_services.job_requeue(user=owner, job=job)
    assert not _free("sim-a", 0)
    agent_heartbeat(node=node, running=[[job.pk, 1, 4242]])  # still stopping
    assert not _free("sim-a", 0)
    agent_heartbeat(node=node, running=[])
    assert _free("sim-a", 0)


def test_a_hold_expires_when_the_end_is_never_reported(
    owner: Any, team: Any, fleet_nodes: Any, settings: Any
) -> None:
    node = fleet_nodes[0]
    job = _running(owner, team, node, 3)
    job_services.job_cancel(user=owner, job=job)
    release = GpuRelease.objects.get()
    assert release.gpu_indices == [3]
    later = release.expires_at + timedelta(seconds=1)
    node.last_heartbeat = later
    node.save()
    nodes_reap(now=later)
    assert not GpuRelease.objects.exists()
    assert _free("sim-a", 3)


def test_pending_and_held_jobs_make_no_hold(owner: Any, team: Any, fleet_nodes: Any) -> None:
    job = JobFactory(owner=owner, team=team)
    job_services.job_cancel(user=owner, job=job)
    assert not GpuRelease.objects.exists()


def test_a_down_node_makes_no_hold(owner: Any, team: Any, fleet_nodes: Any) -> None:
    node = fleet_nodes[0]
    job = _running(owner, team, node, 1)
    node.state = "down"
    node.save()
    job_services.job_cancel(user=owner, job=job)
    assert not GpuRelease.objects.exists()
