"""fleetctl and job arrays, end to end: the installed console script against a live server."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _nodes(fleet_nodes: Any) -> None:
    """sim-a (4 A100-80GB) and sim-b (2 V100-32GB)."""


def test_submit_an_array_list_its_tasks_and_cancel_it(
    fleetctl: Any, tokens: dict[str, str]
) -> None:
    token = tokens["owner"]
    result = fleetctl("submit", "--array", "0-9", "--name", "sweep", "--", "echo", "hi",
                      token=token)  # fmt: skip
    assert result.rc == 0, result.err
    tasks = list(Job.objects.filter(name="sweep").order_by("array_index"))
    array_id = tasks[0].array_id
    assert [t.array_index for t in tasks] == list(range(10))
    assert {t.array_id for t in tasks} == {array_id}
    first, last = tasks[0].pk, tasks[-1].pk
    assert result.out.strip() == f"Submitted job array {array_id}: 10 tasks, jobs {first}-{last}"

    Job.objects.filter(pk=tasks[3].pk).update(state="succeeded")
    listed = fleetctl("ls", "--array", str(array_id), token=token)
    assert listed.rc == 0, listed.err
    head, *rows = listed.out.splitlines()
    assert head.split()[0] == "JOBID"
    shown = [r.split()[0] for r in rows]
    assert shown == [f"{array_id}_{i}" for i in range(10) if i != 3]
    everything = fleetctl("ls", "--array", str(array_id), "--all", token=token)
    assert [r.split()[0] for r in everything.out.splitlines()[1:]] == [
        f"{array_id}_{i}" for i in range(10)
    ]
    queue = fleetctl("ls", token=token)
    assert f"{array_id}_0" in queue.out.split()

    refused = fleetctl("cancel", str(array_id), "--array", token=tokens["teammate"])
    assert refused.rc == 1
    assert "Only the array's owner" in refused.err
    assert Job.objects.filter(array_id=array_id, state="pending").count() == 9

    cancelled = fleetctl("cancel", str(array_id), "--array", token=token)
    assert cancelled.rc == 0, cancelled.err
    assert cancelled.out.strip() == f"job array {array_id}: 9 tasks cancelled"
    states = set(Job.objects.filter(array_id=array_id).values_list("state", flat=True))
    assert states == {"cancelled", "succeeded"}


def test_a_count_and_a_stepped_array_and_their_json(fleetctl: Any, tokens: dict[str, str]) -> None:
    result = fleetctl("submit", "--json", "-a", "0-15:4", "--", "true", token=tokens["owner"])
    assert result.rc == 0, result.err
    body = result.json()
    assert body["indices"] == [0, 4, 8, 12] and body["task_count"] == 4
    assert len(body["job_ids"]) == 4


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("5-2", "write 2-5 instead"),
        ("a-b", "is not an index or a range"),
        ("1,1", "names index 1 more than once"),
        ("0-9%2", "Remove '%2'"),
        ("0-10000", "at most 10000 are allowed"),
    ],
)
def test_bad_arrays_exit_1_with_the_sentence(
    fleetctl: Any, tokens: dict[str, str], spec: str, needle: str
) -> None:
    result = fleetctl("submit", "--array", spec, "--", "true", token=tokens["owner"])
    assert result.rc == 1
    assert result.err.startswith("fleetctl submit: ") and needle in result.err
    assert not Job.objects.exists()


def test_an_empty_array_option_is_a_usage_error(fleetctl: Any, tokens: dict[str, str]) -> None:
    result = fleetctl("submit", "--array", " ", "--", "true", token=tokens["owner"])
    assert result.rc == 2 and "--array takes indices" in result.err
