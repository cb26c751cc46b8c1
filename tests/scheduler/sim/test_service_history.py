"""The size history the simulator passes to policies, and attained service across attempts."""

from __future__ import annotations

import math

import pytest

from scheduler.core.service_distribution import MIN_SAMPLES
from scheduler.policies import get_policy
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.engine import PolicyDriver, simulate
from scheduler.sim.service import ServiceHistory
from scheduler.sim.state import SimConfig, SimState
from tests.scheduler.sim.conftest import job

ONE_GPU = parse_cluster("1x1xV100")


def test_history_summarizes_sizes_and_limit_ratios() -> None:
    history = ServiceHistory(points=2)
    for i in range(MIN_SAMPLES - 1):
        history.observe(100.0 + i, 0.5)
    assert history.atoms() == ()  # too few yet
    history.observe(1000.0, 2.0)  # runtime past the limit counts as the limit
    history.observe(-5.0, math.nan)  # ignored
    sizes = sorted([100.0 + i for i in range(MIN_SAMPLES - 1)] + [1000.0])
    assert history.atoms() == (sum(sizes[:10]) / 10, sum(sizes[10:]) / 10)
    assert history.ratio_atoms() == (0.5, (9 * 0.5 + 1.0) / 10)


def test_history_keeps_only_the_window() -> None:
    history = ServiceHistory(window=MIN_SAMPLES, points=1)
    for _ in range(MIN_SAMPLES):
        history.observe(10.0)
    for _ in range(MIN_SAMPLES):
        history.observe(30.0)
    assert history.atoms() == (30.0,)


def test_snapshots_carry_the_sizes_of_finished_jobs() -> None:
    # 25 one-GPU jobs of 10 s each, asking for 20 s: once 20 have ended the snapshot shows
    # sizes of 10 GPU-seconds and a runtime / limit ratio of 0.5.
    jobs = [job(i, 0, 10, time_limit=20) for i in range(1, 26)]
    result = simulate(jobs, ONE_GPU, PolicyDriver(get_policy("fcfs")), SimConfig())
    snap = result.state.snapshot()
    assert set(snap.service_distribution) == {10.0}
    assert set(snap.limit_ratio_distribution) == {0.5}


def test_a_restarted_job_reports_the_service_of_its_earlier_attempts() -> None:
    state = SimState([job(1, 0, 100), job(2, 0, 5)], ONE_GPU, SimConfig(checkpointing=True))
    node = ONE_GPU.nodes[0].name
    state.advance(0)
    assert state.start(1, node, (0,)) is None
    state.advance(30)
    assert state.preempt(1) is None
    assert state.start(1, node, (0,)) is None
    assert state.snapshot().running[0].attained_service == pytest.approx(30.0)
