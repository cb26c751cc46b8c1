"""The production snapshot carries what gavel needs: each job class's relative speed per GPU
model, learned from finished jobs' runtimes against their time limits, read again only
every few minutes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduler.cycle import history as history_module
from scheduler.cycle.history import SPEED_TABLE_TTL
from scheduler.cycle.snapshot import build_snapshot
from scheduler.policies.gavel import MIN_SAMPLES
from tests.scheduler.cycle.conftest import make_job, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    history_module._speed_cache.clear()
    yield
    history_module._speed_cache.clear()


def finished(owner: Any, team: Any, node: Any, runtime: float, **fields: Any) -> None:
    end = timezone.now() - timedelta(hours=1)
    fields.setdefault("name", "train")
    make_job(
        owner, team, state="succeeded", time_limit=4000, node=node, gpu_indices=[0], gpus=1,
        started_at=end - timedelta(seconds=runtime), finished_at=end, **fields,
    )  # fmt: skip


def test_speeds_are_learned_per_class_and_model(owner: Any, team: Any) -> None:
    fast, slow = make_node("fast", 1, model="V100"), make_node("slow", 1, model="K80")
    for i in range(MIN_SAMPLES):
        runtime = 100 + 30 * i
        finished(owner, team, fast, runtime)
        finished(owner, team, slow, runtime * 4)
    # A requeued job's runtime is its last attempt's only: it teaches nothing.
    finished(owner, team, slow, 10, requeues=1)
    speeds = build_snapshot(save_usage=False).core.gpu_speeds
    assert speeds["train"] == pytest.approx({"V100": 1.0, "K80": 0.25})


def test_the_table_is_read_again_only_after_its_ttl(owner: Any, team: Any) -> None:
    fast, slow = make_node("fast", 1, model="V100"), make_node("slow", 1, model="K80")
    now = timezone.now()
    assert build_snapshot(now=now, save_usage=False).core.gpu_speeds == {}
    for i in range(MIN_SAMPLES):
        runtime = 100 + 30 * i
        finished(owner, team, fast, runtime, name="")
        finished(owner, team, slow, runtime * 2, name="")
    later = now + timedelta(seconds=SPEED_TABLE_TTL - 1)
    assert build_snapshot(now=later, save_usage=False).core.gpu_speeds == {}
    after = now + timedelta(seconds=SPEED_TABLE_TTL + 1)
    speeds = build_snapshot(now=after, save_usage=False).core.gpu_speeds
    # Jobs without a name are learned for their user.
    assert speeds[f"@{owner.username}"] == pytest.approx({"V100": 1.0, "K80": 0.5})
