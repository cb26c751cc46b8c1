"""The fleet page marks the tiles of a job whose current attempt was found idle, with the
time since its GPUs went idle, and reads every mark in the query that reads the jobs."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.models import Job
from fleet.models.notifications import JobIdle
from fleet.services.job_batches import Dispatch, job_dispatch_starts
from fleet.services.job_reports import job_report_apply
from fleet.services.job_states import SCHEDULER, SYSTEM, Actor, job_transition
from fleet.web.tiles import idle_for
from tests.factories import GpuFactory, JobFactory

pytestmark = pytest.mark.django_db

BADGE = re.compile(r'<span class="badge idle"[^>]*>idle ([^<]+)</span>')


def _run(job: Job, node: Any, indices: list[int]) -> Job:
    job_transition(job_id=job.pk, action="dispatch", actor=SCHEDULER, reason="placed",
                   fields={"node": node, "gpu_indices": indices})  # fmt: skip
    return job_transition(job_id=job.pk, action="start", actor=Actor.node(node.name), reason="")


def _mark(job: Job, attempt: int, went_idle_ago: timedelta, minutes: int = 30) -> None:
    JobIdle.objects.create(
        job=job,
        attempt=attempt,
        detected_at=timezone.now() - went_idle_ago + timedelta(minutes=minutes),
        max_util_percent=1.0,
        minutes=minutes,
    )


def _badges(html: str) -> dict[int, list[str]]:
    """Per GPU tile in page order: the idle badges on it."""
    return {i: BADGE.findall(tile) for i, tile in enumerate(html.split('<li class="tile ')[1:])}


def test_idle_gang_shows_a_badge_on_every_tile_and_old_marks_do_not(
    owner_web: Client, owner: Any, team: Any, fleet_nodes: Any
) -> None:
    a, b = fleet_nodes
    gang: Any = JobFactory(owner=owner, team=team, name="gang", gpus=4, gpus_per_node=2)
    job_dispatch_starts(
        dispatches=[Dispatch(gang.pk, 0, a.pk, (0, 1), "test", members=((b.pk, (0, 1)),))],
        actor=SCHEDULER,
    )
    for node in (a, b):
        job_report_apply(node=node, job_id=gang.pk, attempt=1, state="running", pid=9)
    _mark(gang, 1, timedelta(minutes=40))
    # A mark for an attempt that was requeued is history: the new attempt is not idle.
    again: Any = JobFactory(owner=owner, team=team, name="again", gpus=1)
    _run(again, a, [2])
    job_transition(job_id=again.pk, action="requeue", actor=SYSTEM, reason="node lost")
    _mark(again, 1, timedelta(hours=2))
    _run(again, a, [2])
    busy: Any = JobFactory(owner=owner, team=team, name="busy", gpus=1)
    _run(busy, a, [3])

    html = owner_web.get("/fleet/").content.decode()
    tiles = _badges(html)
    # sim-a GPUs 0-3, then sim-b GPUs 0-1: the gang's four tiles carry the badge.
    assert tiles == {0: ["40 min"], 1: ["40 min"], 2: [], 3: [], 4: ["40 min"], 5: ["40 min"]}
    assert html.count("tile util-none held job-idle") == 4


def test_one_query_reads_every_idle_mark(
    owner_web: Client, owner: Any, team: Any, fleet_nodes: Any
) -> None:
    a = fleet_nodes[0]
    first: Any = JobFactory(owner=owner, team=team, gpus=1)
    _run(first, a, [0])
    _mark(first, 1, timedelta(minutes=5))

    def page_queries() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as ctx:
            html = owner_web.get("/fleet/").content.decode()
        return len(ctx.captured_queries), html

    few, html = page_queries()
    assert BADGE.findall(html) == ["5 min"]
    for index in range(1, 4):
        job: Any = JobFactory(owner=owner, team=team, gpus=1)
        _run(job, a, [index])
        _mark(job, 1, timedelta(hours=index, minutes=7))
    for index in range(8):
        GpuFactory(node=fleet_nodes[1], index=2 + index, model="V100-32GB", memory_mb=32768)
    many, html = page_queries()
    assert sorted(BADGE.findall(html)) == ["1 h 7 min", "2 h 7 min", "3 h 7 min", "5 min"]
    assert many == few


def test_idle_for_reads_like_a_person_would_say_it() -> None:
    assert idle_for(59) == "0 min"
    assert idle_for(61 * 60) == "1 h 1 min"
    assert idle_for(2 * 3600) == "2 h"
    assert idle_for(26 * 3600 + 5 * 60) == "1 d 2 h"


def test_a_free_gpu_says_free_so_that_idle_means_only_the_badge() -> None:
    from fleet.web.tiles import tile_html
    from fleet.web.views.fleet import Tile

    html = str(tile_html(Tile(index=0, model="A100-80GB", memory_mb=81920, jobs=[]), "/jobs/"))
    assert '<div class="t-job free">free</div>' in html and "idle" not in html
