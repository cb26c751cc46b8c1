"""The scheduling cycle's dispatch returns only what the starts need (`job_dispatch_starts`)
and builds the start messages from it: the same messages the per-job path sends for the
same attempt (the reaper's resend), sent only once the dispatch commits."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from fleet.models import Job, JobEvent, JobMember, Node
from fleet.models.jobs import JobArray
from fleet.services import messaging
from fleet.services.dispatch import send_start_on_commit, send_starts_on_commit
from fleet.services.job_batches import Dispatch, job_dispatch_starts
from fleet.services.job_states import SCHEDULER
from tests.scheduler.cycle.conftest import make_job, make_node

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def nodes(db: Any) -> list[Node]:
    out = []
    for i, name in enumerate(("sim-a", "sim-b", "sim-c")):
        node = make_node(name, 4)
        # sim-c registered no address: peers reach it by its name.
        address = "" if name == "sim-c" else f"10.0.0.{i + 1}"
        Node.objects.filter(pk=node.pk).update(address=address, last_heartbeat=timezone.now())
        node.refresh_from_db()
        out.append(node)
    return out


def starts_of(sent: list[Any]) -> list[tuple[str, int, int, dict[str, Any]]]:
    """(node, job id, attempt, spec) of each start, in the order sent."""
    return [
        (queue.removeprefix("node."), args["job_id"], args["attempt"], args["spec"])
        for task, queue, args in sent
        if task == messaging.START_JOB_TASK
    ]


def test_the_starts_are_those_the_per_job_path_sends_and_leave_on_commit(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    a, b, c = nodes
    array = JobArray.objects.create(owner=owner, team=team, name="sweep", spec="0-3", task_count=4)
    task = make_job(
        owner, team, gpus=1, env={"SEED": "7"}, workdir="/w", cpus=2, memory_mb=4096,
        array=array, array_index=2,
    )  # fmt: skip
    fraction = make_job(owner, team, gpus=0, gpu_memory_mb=4096, gpu_compute_percent=25)
    gang = make_job(owner, team, gpus=4, gpus_per_node=2, time_limit=600)
    moved_away = make_job(owner, team, gpus=1)
    Job.objects.filter(pk=moved_away.pk).update(attempt=1)  # dispatched since the decision
    dispatches = [
        Dispatch(gang.pk, 0, a.pk, (2, 3), "gang", members=((c.pk, (0, 1)),)),
        Dispatch(task.pk, 0, b.pk, (1,), "task"),
        Dispatch(fraction.pk, 0, c.pk, (3,), "fraction"),
        Dispatch(moved_away.pk, 0, b.pk, (2,), "stale"),
    ]
    with transaction.atomic():
        starts = job_dispatch_starts(dispatches=dispatches, actor=SCHEDULER)
        send_starts_on_commit(starts)
        assert sent == []  # nothing leaves before the transition commits
    assert [s.job.id for s in starts] == [gang.pk, task.pk, fraction.pk]
    fast = starts_of(sent)
    assert [(node, job_id) for node, job_id, _, _ in fast] == [
        ("sim-a", gang.pk), ("sim-c", gang.pk), ("sim-b", task.pk), ("sim-c", fraction.pk),
    ]  # fmt: skip
    assert fast[2][3]["array"] == {"job_id": array.pk, "index": 2, "count": 4}
    assert fast[1][3]["rendezvous"]["hosts"] == ["10.0.0.1", "sim-c"]
    # The same attempt's starts sent again from the jobs as stored: the same messages.
    sent.clear()
    for job in (gang, task, fraction):
        job.refresh_from_db()
        with transaction.atomic():
            send_start_on_commit(job)
    assert starts_of(sent) == fast
    assert not JobEvent.objects.filter(job=moved_away).exists()
    assert not JobMember.objects.filter(job=moved_away).exists()


def test_a_dispatch_rolled_back_sends_no_start(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    job = make_job(owner, team, gpus=1)
    with pytest.raises(RuntimeError), transaction.atomic():
        starts = job_dispatch_starts(
            dispatches=[Dispatch(job.pk, 0, nodes[0].pk, (0,), "test")], actor=SCHEDULER
        )
        send_starts_on_commit(starts)
        assert [s.job.id for s in starts] == [job.pk]
        raise RuntimeError("the cycle failed before commit")
    assert sent == []
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("pending", 0)
