"""Every numeric scheduler parameter has a range; a value outside it is a 400 that names
the parameter and the range, and nothing is written."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.cycle.config import known_params
from scheduler.models import SchedulerSettings

pytestmark = pytest.mark.django_db

URL = "/api/v1/scheduler/"


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"genetic_population": 10**8}, "genetic_population must be at least 0 and at most 10000"),
        ({"annealing_iterations": 10**9}, "annealing_iterations must be at least 0 and at most"),
        ({"ilp_time_limit": 86400}, "ilp_time_limit must be at least 0 and at most 600"),
        ({"genetic_mutation": 1.5}, "genetic_mutation must be at least 0 and at most 1"),
        ({"priority_weight_age": 1e300}, "priority_weight_age must be at least 0 and at most"),
        ({"seed": -1}, "seed must be at least 0 and at most 4294967295"),
        ({"qos_ranks": {"high": 10**9}}, "qos_ranks must be at least -1000 and at most 1000"),
        ({"las_queue_thresholds": [1, 1e12]}, "las_queue_thresholds must be at least 0"),
        ({"las_queue_thresholds": list(range(100))}, "takes at most 64 entries"),
    ],
)  # fmt: skip
def test_a_parameter_out_of_range_is_refused_with_its_range(
    staff_api: Any, params: dict[str, Any], needle: str
) -> None:
    response = staff_api.patch(URL, {"params": params}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert needle in body["message"]
    assert any(needle in error for error in body["extra"]["fields"]["params"])
    assert not (SchedulerSettings.objects.first().params or {})


def test_values_inside_the_ranges_are_kept(staff_api: Any) -> None:
    params = {"genetic_population": 10000, "ilp_time_limit": 600, "seed": 2**32 - 1}
    response = staff_api.patch(URL, {"params": params}, format="json")
    assert response.status_code == 200
    assert response.json()["params"] == params


def test_every_numeric_parameter_has_a_range_and_the_api_shows_it(owner_api: Any) -> None:
    numeric = {k: p for k, p in known_params().items() if p.kind in ("int", "number", "numbers")}
    assert numeric and all(p.maximum is not None for p in numeric.values())
    assert all(p.minimum is not None and p.minimum <= p.maximum for p in numeric.values())
    shown = owner_api.get(URL).json()["known_params"]["genetic_population"]
    assert (shown["minimum"], shown["maximum"]) == (0, 10000)
