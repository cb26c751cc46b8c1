"""GPU-hours per team and user over a period, clipped to the period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from fleet.selectors.usage import gpu_hours, team_allocation
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _job(owner: Any, team: Any, start: datetime | None, end: datetime | None, **kw: Any) -> Any:
    return JobFactory(owner=owner, team=team, started_at=start, finished_at=end,
                      state="succeeded" if end else "running", **kw)  # fmt: skip


def test_gpu_hours_clip_to_the_period_and_weigh_gpus(
    owner: Any, teammate: Any, outsider: Any, team: Any, other_team: Any
) -> None:
    h = timedelta(hours=1)
    # 2 GPUs, started 1 h before the period, ran 3 h: 2 h inside -> 4 GPU-h.
    _job(owner, team, T0 - h, T0 + 2 * h, gpus=2)
    # Still running at `now` (T0 + 5 h), started at T0 + 4 h: 1 h x 1 GPU.
    _job(teammate, team, T0 + 4 * h, None, gpus=1)
    # Fractional: 50 % of one GPU for 2 h -> 1 GPU-h.
    _job(outsider, other_team, T0, T0 + 2 * h, gpus=0, gpu_memory_mb=1000, gpu_compute_percent=50)
    # Finished before the period and never started: nothing.
    _job(owner, team, T0 - 3 * h, T0 - 2 * h, gpus=8)
    JobFactory(owner=owner, team=team, gpus=8)
    usage = gpu_hours(since=T0, until=T0 + 24 * h, now=T0 + 5 * h)
    assert usage.by_team == pytest.approx({"vision": 5.0, "speech": 1.0})
    assert usage.by_user == pytest.approx(
        {("vision", "owner"): 4.0, ("vision", "teammate"): 1.0, ("speech", "outsider"): 1.0}
    )


def test_allocation_counts_assigned_and_running(owner: Any, team: Any, other_team: Any) -> None:
    team.guaranteed_gpus = 4
    team.save()
    _job(owner, team, T0, None, gpus=3)
    JobFactory(owner=owner, team=team, gpus=2)  # pending: not allocated
    rows = {r["slug"]: r for r in team_allocation()}
    assert (rows["vision"]["guaranteed"], rows["vision"]["allocated"]) == (4, 3.0)
    assert rows["speech"]["allocated"] == 0


def test_usage_page_and_json(owner_web: Client, owner: Any, team: Any) -> None:
    html = owner_web.get("/usage/?period=24h").content.decode()
    assert "last 24h" in html and "vision" in html
    data = owner_web.get("/usage.json?period=30d").json()
    assert set(data["figures"]) == {"teams", "users", "allocation"}
    assert [t["slug"] for t in data["teams"]] == ["vision"]
