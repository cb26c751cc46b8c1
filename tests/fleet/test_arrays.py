"""Job arrays and bulk submits over REST (docs/arrays.md)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from fleet.models import Job, JobEvent, JobState
from fleet.models.jobs import JobArray
from fleet.services import messaging
from fleet.services.dispatch import start_spec

pytestmark = pytest.mark.django_db

SUBMIT = "/api/v1/jobs/"
BULK = "/api/v1/jobs/bulk/"


def _array(api: Any, array: Any, **overrides: Any) -> Any:
    body = {"name": "sweep", "command": "python sweep.py", "gpus": 1, "array": array, **overrides}
    return api.post(SUBMIT, body, format="json")


def _job(**overrides: Any) -> dict[str, Any]:
    return {"name": "train", "command": "python train.py", "gpus": 1, **overrides}


@pytest.mark.parametrize(
    ("array", "indices"),
    [
        ("0-9", list(range(10))),
        (4, [0, 1, 2, 3]),
        ("0-15:4", [0, 4, 8, 12]),
        ("1,3,5-7", [1, 3, 5, 6, 7]),
        (" 7 ", [7]),
        ("10-12,2", [2, 10, 11, 12]),
    ],
)
def test_an_array_is_one_pending_job_per_index(
    owner_api: Any, fleet_nodes: Any, array: Any, indices: list[int]
) -> None:
    response = _array(owner_api, array, env={"LR": "0.1"})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["indices"] == indices and body["task_count"] == len(indices)
    jobs = list(Job.objects.filter(array_id=body["array_id"]).order_by("array_index"))
    assert [j.array_index for j in jobs] == indices
    assert [j.pk for j in jobs] == body["job_ids"]
    assert {(j.state, j.name, j.command, j.gpus) for j in jobs} == {
        (JobState.PENDING, "sweep", "python sweep.py", 1)
    }
    assert all(j.env == {"LR": "0.1"} for j in jobs)
    events = JobEvent.objects.filter(job_id__in=body["job_ids"], to_state="pending")
    assert events.count() == len(indices)
    one = owner_api.get(f"{SUBMIT}{jobs[-1].pk}/").json()
    assert (one["array_id"], one["array_index"]) == (body["array_id"], indices[-1])


@pytest.mark.parametrize(
    ("array", "needle"),
    [
        ("5-2", "ends before it starts; write 2-5 instead"),
        ("a-b", "'a-b' is not an index or a range"),
        ("1,3,3-7", "names index 3 more than once"),
        ("-3", "is negative; indices start at 0"),
        ("0--3", "is negative"),
        ("0-9:0", "step of '0-9:0' must be 1 or more"),
        ("", "array is empty"),
        (0, "asks for no tasks"),
        (-4, "asks for no tasks"),
        (True, "Give a count such as 16"),
        ([1, 2], "Give a count such as 16"),
        ("0-99%10", "does not limit how many tasks of an array run at once"),
        ("0-10000", "The array has 10001 tasks; at most 10000 are allowed"),
        (20000, "The array has 20000 tasks; at most 10000"),
        ("0-4294967296", "indices go up to 2147483647"),
    ],
)
def test_bad_array_specs_are_refused_on_the_array_field_with_what_to_write(
    owner_api: Any, fleet_nodes: Any, array: Any, needle: str
) -> None:
    response = _array(owner_api, array)
    assert response.status_code == 400, response.json()
    body = response.json()
    assert needle in body["message"], body
    assert "array" in body["extra"]["fields"]
    assert not Job.objects.exists() and not JobArray.objects.exists()


def test_the_array_cap_is_a_setting(owner_api: Any, fleet_nodes: Any, settings: Any) -> None:
    settings.FLEET_MAX_ARRAY_SIZE = 5
    assert _array(owner_api, 5).status_code == 201
    refused = _array(owner_api, "0-5")
    assert refused.status_code == 400
    assert "at most 5 are allowed in one array" in refused.json()["message"]


def test_an_array_of_a_job_no_node_can_run_is_refused_whole(
    owner_api: Any, fleet_nodes: Any
) -> None:
    response = _array(owner_api, "0-99", gpus=8)
    assert response.status_code == 400
    assert response.json()["extra"]["fields"]["gpus"]
    assert not Job.objects.exists() and not JobArray.objects.exists()


def test_list_filters_by_array(owner_api: Any, fleet_nodes: Any) -> None:
    first = _array(owner_api, 3).json()
    _array(owner_api, 2)
    owner_api.post(SUBMIT, _job(), format="json")
    listed = owner_api.get(f"{SUBMIT}?array={first['array_id']}").json()
    assert sorted(j["id"] for j in listed["results"]) == sorted(first["job_ids"])
    for bad in ("nope", "1.5", "0", "-3", str(2**63), "1e30"):
        refused = owner_api.get(f"{SUBMIT}?array={bad}")
        assert refused.status_code == 400, bad
        assert "whole number from 1 to" in refused.json()["extra"]["fields"]["array"][0]
    assert owner_api.get(f"{SUBMIT}?array={2**63 - 1}").json()["results"] == []


def test_array_detail_counts_states(owner_api: Any, outsider_api: Any, fleet_nodes: Any) -> None:
    body = _array(owner_api, 4).json()
    Job.objects.filter(id=body["job_ids"][0]).update(state="running")
    seen = outsider_api.get(f"/api/v1/arrays/{body['array_id']}/").json()
    assert seen["task_count"] == 4 and seen["states"] == {"pending": 3, "running": 1}
    assert seen["owner"] == "owner" and seen["array"] == "4"
    assert owner_api.get("/api/v1/arrays/424242/").status_code == 404


@pytest.mark.parametrize("who", ["owner_api", "team_admin_api", "staff_api"])
def test_cancel_of_an_array_cancels_every_task_not_ended(
    request: Any,
    owner_api: Any,
    fleet_nodes: Any,
    sent: Any,
    django_capture_on_commit_callbacks: Any,
    who: str,
) -> None:
    body = _array(owner_api, 4).json()
    done, running, held, _ = body["job_ids"]
    Job.objects.filter(id=done).update(state="succeeded")
    Job.objects.filter(id=held).update(state="held")
    Job.objects.filter(id=running).update(
        state="running", attempt=1, node=fleet_nodes[0], gpu_indices=[2]
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = request.getfixturevalue(who).post(
            f"/api/v1/arrays/{body['array_id']}/cancel/", {"reason": "bad sweep"}, format="json"
        )
    assert response.status_code == 200, response.json()
    assert response.json()["cancelled"] == 3
    assert response.json()["states"] == {"cancelled": 3, "succeeded": 1}
    states = dict(Job.objects.filter(array_id=body["array_id"]).values_list("id", "state"))
    assert states.pop(done) == "succeeded" and set(states.values()) == {"cancelled"}
    events = JobEvent.objects.filter(job_id__in=body["job_ids"], to_state="cancelled")
    assert sorted(events.values_list("job_id", "from_state", "reason")) == sorted(
        [
            (running, "running", "bad sweep"),
            (held, "held", "bad sweep"),
            (body["job_ids"][3], "pending", "bad sweep"),
        ]
    )
    assert Job.objects.get(id=held).finished_at is not None
    stops = [s for s in sent if s[0] == messaging.STOP_JOB_TASK]
    assert stops == [
        (
            messaging.STOP_JOB_TASK,
            "node.sim-a",
            {"job_id": running, "attempt": 1, "reason": "bad sweep"},
        )
    ]


@pytest.mark.parametrize("who", ["teammate_api", "outsider_api", "stranger_api"])
def test_others_may_not_cancel_an_array(
    request: Any, owner_api: Any, fleet_nodes: Any, who: str
) -> None:
    body = _array(owner_api, 3).json()
    response = request.getfixturevalue(who).post(f"/api/v1/arrays/{body['array_id']}/cancel/")
    assert response.status_code == 403
    assert set(Job.objects.values_list("state", flat=True)) == {"pending"}


def test_start_message_of_a_task_names_its_array(owner_api: Any, fleet_nodes: Any) -> None:
    body = _array(owner_api, "3,5,9").json()
    Job.objects.filter(array_id=body["array_id"]).update(
        state="assigned", attempt=1, node=fleet_nodes[0], gpu_indices=[0]
    )
    task = Job.objects.get(array_id=body["array_id"], array_index=5)
    assert start_spec(task)["array"] == {"job_id": body["array_id"], "index": 5, "count": 3}
    single = owner_api.post(SUBMIT, _job(), format="json").json()
    Job.objects.filter(id=single["id"]).update(node=fleet_nodes[0], gpu_indices=[1])
    assert start_spec(Job.objects.get(id=single["id"]))["array"] is None


def test_bulk_submit_creates_every_job_in_order(owner_api: Any, fleet_nodes: Any) -> None:
    specs = [_job(name=f"j{i}", gpus=1 + i % 2) for i in range(5)]
    response = owner_api.post(BULK, {"jobs": specs}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["count"] == 5
    jobs = [Job.objects.get(id=i) for i in body["job_ids"]]
    assert [(j.name, j.gpus, j.state, j.array_id) for j in jobs] == [
        (f"j{i}", 1 + i % 2, "pending", None) for i in range(5)
    ]
    assert JobEvent.objects.filter(job_id__in=body["job_ids"]).count() == 5


def test_bulk_checks_plain_items_without_the_serializer(
    owner_api: Any, fleet_nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain items take the lean check of single submits; an item it cannot vouch for (a
    number sent as a string) still goes through the serializer, and both are stored alike."""
    from fleet.api.jobs import JobRequestInput

    seen: list[Any] = []
    validate = JobRequestInput.run_validation

    def counted(self: Any, data: Any) -> Any:
        seen.append(data)
        return validate(self, data)

    monkeypatch.setattr(JobRequestInput, "run_validation", counted)
    specs = [_job(name="plain-0"), _job(name="plain-1", gpus=2), _job(name="text", gpus="2")]
    response = owner_api.post(BULK, {"jobs": specs}, format="json")
    assert response.status_code == 201, response.json()
    assert seen == [specs[2]]
    jobs = [Job.objects.get(id=i) for i in response.json()["job_ids"]]
    assert [(j.name, j.gpus, j.command) for j in jobs] == [
        ("plain-0", 1, "python train.py"),
        ("plain-1", 2, "python train.py"),
        ("text", 2, "python train.py"),
    ]


@pytest.mark.parametrize(
    ("bad", "where", "needle"),
    [
        ({"gpus": 8}, "jobs[2].gpus", "needs 8 GPUs on one node"),
        ({"gpus": "many"}, "jobs[2].gpus", "valid integer"),
        ({"colour": "red"}, "jobs[2].colour", "Unknown field"),
        ({"array": "0-3"}, "jobs[2].array", "Unknown field"),
        ({"team": "speech"}, "jobs[2].team", "not a member of team 'speech'"),
        ({"command": ""}, "jobs[2].command", ""),
    ],
)
def test_one_bad_bulk_item_refuses_the_whole_request_naming_its_index(
    owner_api: Any, fleet_nodes: Any, bad: dict[str, Any], where: str, needle: str
) -> None:
    specs = [_job(), _job(), _job(**bad), _job()]
    response = owner_api.post(BULK, {"jobs": specs}, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["message"].startswith(f"{where}: "), body
    assert needle in body["message"]
    assert body["extra"]["index"] == 2
    assert body["extra"]["fields"] == {"jobs": [body["message"]]}
    field = where.split(".", 1)[1]
    assert field in body["extra"]["item_fields"]
    assert not Job.objects.exists()


def test_bulk_refuses_an_empty_list_a_non_list_and_too_many(
    owner_api: Any, fleet_nodes: Any, settings: Any
) -> None:
    assert owner_api.post(BULK, {"jobs": []}, format="json").status_code == 400
    assert owner_api.post(BULK, {"jobs": "x"}, format="json").status_code == 400
    assert owner_api.post(BULK, [_job()], format="json").status_code == 400
    settings.FLEET_MAX_BULK_JOBS = 3
    refused = owner_api.post(BULK, {"jobs": [_job()] * 4}, format="json")
    assert refused.status_code == 400
    assert "at most 3 are allowed in one bulk submit" in refused.json()["message"]
    assert not Job.objects.exists()


def test_bulk_is_refused_to_a_stranger(stranger_api: Any, fleet_nodes: Any) -> None:
    assert stranger_api.post(BULK, {"jobs": [_job()]}, format="json").status_code == 403


def _queries(fn: Any) -> int:
    """Queries one request made (which must succeed)."""
    with CaptureQueriesContext(connection) as ctx:
        response = fn()
    assert response.status_code == 201, response.json()
    return len(ctx.captured_queries)


def test_bulk_and_array_queries_do_not_grow_with_the_number_of_jobs(
    owner_api: Any, fleet_nodes: Any
) -> None:
    def bulk(n: int) -> int:
        return _queries(lambda: owner_api.post(BULK, {"jobs": [_job()] * n}, format="json"))

    def array(n: int) -> int:
        return _queries(lambda: _array(owner_api, n))

    bulk(1)  # warm up (content types, the first token lookups)
    if connection.vendor == "postgresql":  # one statement per column set, whatever the count
        assert bulk(3) == bulk(60)
        assert array(3) == array(60)
    else:  # the ORM writes in batches: a few more statements, never one per job
        assert bulk(60) - bulk(3) <= 4
        assert array(60) - array(3) <= 4


def test_a_single_submit_takes_a_bounded_number_of_queries(
    owner_api: Any, fleet_nodes: Any
) -> None:
    owner_api.post(SUBMIT, _job(), format="json")
    count = _queries(lambda: owner_api.post(SUBMIT, _job(), format="json"))
    # token and user, memberships with teams, node shapes, savepoint, job, event, release
    assert count <= 7, count


def test_many_submits_ask_for_a_cycle_now_and_one_more_after_the_window(
    owner_api: Any, fleet_nodes: Any, sent: Any, django_capture_on_commit_callbacks: Any
) -> None:
    messaging.schedule_window_reset()
    with django_capture_on_commit_callbacks(execute=True):
        _array(owner_api, 50)
        owner_api.post(BULK, {"jobs": [_job()] * 5}, format="json")
        owner_api.post(SUBMIT, _job(), format="json")
        owner_api.post(SUBMIT, _job(), format="json")
    cycles = [kw for task, _, kw in sent if task == messaging.SCHEDULE_TASK]
    assert len(cycles) == 2


def test_team_idle_util_percent_is_held_to_0_100_by_the_database(team: Any) -> None:
    for bad in (-1, 100.5):
        with pytest.raises(IntegrityError), transaction.atomic():
            type(team).objects.filter(pk=team.pk).update(idle_util_percent=bad)
    type(team).objects.filter(pk=team.pk).update(idle_util_percent=100)


def test_job_page_and_queue_show_the_task_as_array_and_index(
    owner: Any, owner_api: Any, fleet_nodes: Any, client: Any
) -> None:
    body = _array(owner_api, "4-5").json()
    task = Job.objects.get(array_id=body["array_id"], array_index=5)
    Job.objects.filter(pk=body["job_ids"][0]).update(
        state="running", node=fleet_nodes[0], gpu_indices=[0]
    )
    client.force_login(owner)
    label = f"{body['array_id']}[5]"
    page = client.get(f"/jobs/{task.pk}/").content.decode()
    assert f"Job #{task.pk} · " in page and label in page
    queue = client.get("/queue/").content.decode()
    assert f"#{task.pk} {label} sweep" in queue
    assert f"#{body['job_ids'][0]} {body['array_id']}[4] sweep" in queue
    single = owner_api.post(SUBMIT, _job(), format="json").json()
    assert "[" not in client.get(f"/jobs/{single['id']}/").content.decode().split("<h1>")[1][:40]


def test_admission_reads_the_fleet_in_one_query_and_counts_nodes_of_one_shape(
    owner_api: Any, fleet_nodes: Any
) -> None:
    from scheduler.cycle.admission import fleet_nodes as read_fleet
    from tests.factories import GpuFactory, NodeFactory

    for name in ("sim-c", "sim-d"):
        node = NodeFactory(name=name, gpu_backend="simulated")
        for i in (3, 0, 2, 1):
            GpuFactory(node=node, index=i, model="A100-80GB", memory_mb=81920)
    with CaptureQueriesContext(connection) as ctx:
        nodes = read_fleet()
    # The newest GPU's id, then the shapes (PostgreSQL) or the GPUs and their nodes.
    assert len(ctx.captured_queries) == (2 if connection.vendor == "postgresql" else 3)
    shapes = sorted((len(n.gpus), n.gpus[0].model, [g.index for g in n.gpus]) for n in nodes)
    assert shapes == [(2, "V100-32GB", [0, 1])] + [(4, "A100-80GB", [0, 1, 2, 3])] * 3
    # The next submit trusts what this process read while the fleet's shape is unchanged.
    with CaptureQueriesContext(connection) as ctx:
        assert read_fleet() == nodes
    assert len(ctx.captured_queries) == 1 and "GROUP BY" not in ctx.captured_queries[0]["sql"]
    fits = owner_api.post(SUBMIT, _job(gpus=12, gpus_per_node=4), format="json")
    assert fits.status_code == 201, fits.json()
    refused = owner_api.post(SUBMIT, _job(gpus=16, gpus_per_node=4), format="json")
    assert refused.status_code == 400
    assert "the fleet has 3" in refused.json()["message"], refused.json()


def test_the_scheduling_cycle_starts_tasks_with_their_array_in_the_signed_start(
    owner_api: Any, fleet_nodes: Any, sent: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from scheduler.cycle.runner import run_cycle

    body = _array(owner_api, "2,5")
    array_id = body.json()["array_id"]
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle()
    starts = {
        args["job_id"]: args["spec"]["array"]
        for task, _, args in sent
        if task == messaging.START_JOB_TASK
    }
    tasks = dict(Job.objects.filter(array_id=array_id).values_list("id", "array_index"))
    assert starts == {
        job_id: {"job_id": array_id, "index": index, "count": 2} for job_id, index in tasks.items()
    }
