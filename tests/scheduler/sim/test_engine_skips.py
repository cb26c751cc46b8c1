"""Skipping cycles and the policies' shortcuts never change a simulated run.

The reference run asks the policy every cycle, with wait sentences and without the cycle's
shortcuts (settings "fast_paths" false); the default run skips what `skip_rules` calls
exact, drops the sentences and uses the shortcuts.
"""

from __future__ import annotations

import pytest

from scheduler.policies import get_policy
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.engine import PolicyDriver, simulate, skip_rules
from scheduler.sim.sources import synthetic
from scheduler.sim.state import SimConfig
from scheduler.sim.transform import equal_guarantees, prepare

CLUSTER = parse_cluster("2x4xV100+1x8xV100")
NAMES = ["fcfs", "sjf", "priority", "backfill", "fairshare", "las"]


@pytest.fixture(scope="module")
def jobs():
    raw = synthetic(220, total_gpus=CLUSTER.total_gpus, load=0.95, n_teams=3, seed=3, max_gpus=8)
    prepared, _ = prepare(raw, total_gpus=CLUSTER.total_gpus, max_node_gpus=8, seed=3)
    return prepared


def _outcome(result):
    runs = result.state.jobs
    return (
        {i: (r.state, r.first_start, r.finish, r.preemptions) for i, r in runs.items()},
        result.state.invalid_decisions,
    )


@pytest.mark.parametrize("guarantees", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_default_run_equals_the_plain_run(jobs, name, guarantees):
    team_guaranteed = equal_guarantees(jobs, CLUSTER.total_gpus) if guarantees else {}
    plain = SimConfig(
        skip_exact=False,
        explain=True,
        plan_waits=True,
        settings={"fast_paths": False},
        team_guaranteed=team_guaranteed,
    )
    fast = SimConfig(team_guaranteed=team_guaranteed)
    reference = simulate(jobs, CLUSTER, PolicyDriver(get_policy(name)), plain)
    result = simulate(jobs, CLUSTER, PolicyDriver(get_policy(name)), fast)
    assert _outcome(result) == _outcome(reference)
    assert result.cycles <= reference.cycles


@pytest.mark.parametrize(
    ("name", "guarantees", "expected"),
    [
        ("fcfs", False, (True, True)),
        ("sjf", False, (True, True)),
        ("priority", False, (True, False)),
        ("backfill", False, (True, False)),
        ("fcfs", True, (False, False)),
        ("priority", True, (False, False)),
        ("las", False, (False, False)),
    ],
)
def test_skip_rules_follow_what_the_policy_may_do(jobs, name, guarantees, expected):
    team_guaranteed = equal_guarantees(jobs, CLUSTER.total_gpus) if guarantees else {}
    config = SimConfig(team_guaranteed=team_guaranteed)
    assert skip_rules(PolicyDriver(get_policy(name)), jobs, config) == expected
    off = SimConfig(team_guaranteed=team_guaranteed, skip_exact=False)
    assert skip_rules(PolicyDriver(get_policy(name)), jobs, off) == (False, False)


def test_qos_preemption_setting_turns_skipping_off(jobs):
    config = SimConfig(settings={"qos_preemption": True})
    assert skip_rules(PolicyDriver(get_policy("sjf")), jobs, config) == (False, False)


def test_skipping_saves_cycles_for_a_clock_free_policy(jobs):
    every = simulate(jobs, CLUSTER, PolicyDriver(get_policy("sjf")), SimConfig(skip_exact=False))
    skipped = simulate(jobs, CLUSTER, PolicyDriver(get_policy("sjf")), SimConfig())
    assert skipped.cycles < every.cycles
