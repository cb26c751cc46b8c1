"""Every registered production policy on a workload of multi-node gangs with host CPUs and
memory: every job finishes, no decision is skipped, nothing is double-booked at any cycle,
and every member is released."""

import pytest

from scheduler.policies import get_policy, policy_names
from scheduler.sim.engine import PolicyDriver, simulate
from scheduler.sim.metrics import compute_metrics
from scheduler.sim.state import SimConfig

from .test_conservation import GANG_CLUSTER, _check_gang_run, _Checking, gang_jobs  # noqa: F401


@pytest.mark.parametrize("name", policy_names())
def test_policy_places_gangs_and_conserves(gang_jobs, name):  # noqa: F811
    driver = _Checking(PolicyDriver(get_policy(name)))
    result = simulate(gang_jobs, GANG_CLUSTER, driver, SimConfig(restart_overhead=60))
    m = _check_gang_run(result, gang_jobs)
    assert driver.checks > 50
    started = [r for r in result.state.jobs.values() if r.spec.nodes > 1]
    assert all(r.first_start is not None for r in started)
    assert m["gang_jct_avg"] > 0


def test_a_gang_within_one_group_is_preferred_by_the_placement():
    # Two groups of two 4-GPU nodes; one group is half full. An 8-GPU gang fits whole in the
    # other group, so it should not be spread (and not slowed).
    from .conftest import job

    jobs = [job(1, 0, 5000, 4), job(2, 10, 1000, 8, gpus_per_node=4)]
    cluster = GANG_CLUSTER
    result = simulate(jobs, cluster, PolicyDriver(get_policy("fcfs")), SimConfig())
    runs = result.state.jobs
    assert runs[2].slowdown == 1.0
    assert compute_metrics(result)["spread_gpu_seconds"] == 0
