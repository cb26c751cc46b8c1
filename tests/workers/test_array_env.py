"""A task of a job array on a real agent sees its array id, index and task count, from the
signed start message the control side builds; a malformed array in a start is refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fleet.models import Job
from fleet.services import messaging
from fleet.services.job_arrays import job_array_submit
from fleet.services.job_states import SCHEDULER, job_transition
from fleet.services.jobs import JobRequest
from tests.factories import JobFactory
from tests.workers.agent_harness import ControlPump, dispatch
from tests.workers.conftest import StartAgent

pytestmark = pytest.mark.django_db

PRINT = (
    'echo "array=$FLEET_ARRAY_JOB_ID index=$FLEET_ARRAY_INDEX count=$FLEET_ARRAY_TASK_COUNT '
    'job=$FLEET_JOB_ID"'
)


def ended(job: Job) -> Callable[[], Job | None]:
    def check() -> Job | None:
        current = Job.objects.get(pk=job.pk)
        return current if current.state in ("succeeded", "failed") else None

    return check


def test_each_task_sees_its_index_and_the_array(
    agents: StartAgent, control: ControlPump, owner: Any, owner_api: Any, team: Any
) -> None:
    node, _ = agents()
    job_array, tasks = job_array_submit(
        user=owner,
        request=JobRequest(name="sweep", command=PRINT, gpus=1, env={"FLEET_SIM_UTIL": "5"}),
        array="3,7",
    )
    for gpu, task in enumerate(tasks):
        dispatch(control, task, node, gpus=(gpu,))
    for task in tasks:
        done = control.pump(ended(task), what=f"task {task.array_index} to end")
        assert done.state == "succeeded", done.state_reason

        def log(task: Job = task) -> Any:
            body = owner_api.get(f"/api/v1/jobs/{task.pk}/logs/").json()
            return body if body["complete"] else None

        body = control.pump(log, what="the log to be complete")
        assert body["data"] == (
            f"array={job_array.pk} index={task.array_index} count=2 job={task.pk}\n"
        )


def test_a_job_outside_any_array_sees_no_array_variables(
    agents: StartAgent, control: ControlPump, owner: Any, owner_api: Any, team: Any
) -> None:
    node, _ = agents()
    job = JobFactory(owner=owner, team=team, command=PRINT)
    dispatch(control, job, node)
    assert control.pump(ended(job), what="the job to end").state == "succeeded"
    body = control.pump(
        lambda: (lambda b: b if b["complete"] else None)(
            owner_api.get(f"/api/v1/jobs/{job.pk}/logs/").json()
        ),
        what="the log",
    )
    assert body["data"] == f"array= index= count= job={job.pk}\n"


@pytest.mark.parametrize(
    ("array", "needle"),
    [
        ({"job_id": 4, "index": -1, "count": 2}, "index=-1; it must be a whole number from 0"),
        ({"job_id": 4, "index": 0, "count": "2"}, "count='2'; it must be a whole number"),
        ({"job_id": 4, "index": 0}, "the array lacks 'count'"),
        ([4, 0, 2], "the array is list, not an object"),
    ],
)
def test_a_start_with_a_malformed_array_is_refused_with_its_reason(
    agents: StartAgent, control: ControlPump, owner: Any, team: Any, array: Any, needle: str
) -> None:
    node, agent = agents()
    job = JobFactory(owner=owner, team=team, command="echo should not run")

    def go() -> None:
        job_transition(job_id=job.pk, action="dispatch", actor=SCHEDULER,
                       fields={"node": node, "gpu_indices": [0]})  # fmt: skip
        spec = {"command": job.command, "gpu_indices": [0], "array": array}
        messaging.send_to_node_on_commit(
            node.name, messaging.START_JOB_TASK, job_id=job.pk, attempt=1, spec=spec
        )

    control.run(go)
    reports = control.listen(
        lambda: [a for _, a in control.opened("fleet.tasks.job_report") if a["job_id"] == job.pk],
        what="the refusal",
    )
    assert reports[0]["state"] == "failed"
    assert needle in reports[0]["reason"]
    assert not list((agent.state_dir / "logs").glob(f"{job.pk}.*.log")) or all(
        p.read_text() == "" for p in (agent.state_dir / "logs").glob(f"{job.pk}.*.log")
    )


def test_an_attempt_record_keeps_the_array_across_an_agent_restart() -> None:
    from dataclasses import asdict

    from workers.executor.spec import JobSpec, job_environment, spec_from_start

    spec = spec_from_start(
        7, 1, {"command": "true", "array": {"job_id": 3, "index": 9, "count": 10}},
        log_path="/tmp/x.log", default_grace=2,
    )  # fmt: skip
    again = JobSpec.from_record(asdict(spec))
    assert again == spec
    env = job_environment(again, base_env={})
    assert (env["FLEET_ARRAY_JOB_ID"], env["FLEET_ARRAY_INDEX"], env["FLEET_ARRAY_TASK_COUNT"]) == (
        "3", "9", "10",
    )  # fmt: skip
    own = JobSpec(job_id=8, attempt=1, command="true", log_path="/tmp/y.log",
                  env={"FLEET_ARRAY_INDEX": "99"})  # fmt: skip
    assert "FLEET_ARRAY_INDEX" not in job_environment(own, base_env={})
