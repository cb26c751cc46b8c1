"""Once a request shape found no room, the walk passes over the later jobs of that shape
(free capacity only shrinks during a walk), with the plan of the plain walk. (Where the
queue's rows are kept: the priority and Gittins orders', from the second cycle on the same
jobs.)"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from scheduler.policies import get_policy
from scheduler.policies.base import Cycle
from tests.scheduler.core.builders import job, node, running, snap


def _one_v100_free():
    """One V100 free; every A100 taken; 150 jobs asking for an A100, then one asking for a
    V100 (submitted last, so last in the priority order)."""
    nodes = [node("a", 8, model="A100"), node("v", 8, model="V100", memory_mb=32768)]
    run = [running(1, "a", tuple(range(8))), running(2, "v", tuple(range(7)))]
    pending = [job(100 + k, 1, gpu_model="A100", submitted=float(k)) for k in range(150)]
    pending.append(job(900, 1, gpu_model="V100", submitted=500.0))
    return snap(nodes, pending, run, settings={"priority_reservation": False}, now=5000.0)


@pytest.mark.parametrize("name", ["priority", "backfill", "gittins", "gittins-tiers"])
@pytest.mark.parametrize("extra", [{}, {"explain": False}, {"explain": False, "plan_waits": False}])
def test_jobs_of_a_shape_without_room_are_passed_over(name, extra, monkeypatch) -> None:
    snapshot = _one_v100_free()
    snapshot = replace(snapshot, settings=MappingProxyType({**snapshot.settings, **extra}))
    plain = replace(snapshot, settings=MappingProxyType({**snapshot.settings, "fast_paths": False}))
    reference = get_policy(name).schedule(plain)
    considered = []
    original = Cycle.consider

    def spy(self, job):
        considered.append(job.id)
        return original(self, job)

    policy = get_policy(name)
    policy.schedule(snapshot)  # the rows are kept from the second cycle on these objects
    monkeypatch.setattr(Cycle, "consider", spy)
    fast = policy.schedule(snapshot)
    if extra.get("plan_waits", True):
        assert fast == reference
    else:
        assert replace(fast, order=()) == replace(reference, order=())
        assert fast.order == reference.order[: len(fast.order)]
    assert [p.job_id for p in reference.places] == [900]
    assert considered[0] == 100 and considered[-1] == 900
    assert len(considered) <= 3  # not the other 149 A100 jobs
