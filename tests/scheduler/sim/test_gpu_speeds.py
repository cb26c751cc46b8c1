"""Jobs run at their speed on the GPU model they get: a job's duration is its runtime at speed
1.0, progress kept over a preemption is work done, whatever model did it, and jobs without
speeds run as before on every model."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.policies.gavel import MIN_SAMPLES
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.sources import load_jobs
from scheduler.sim.state import SimConfig, SimState
from scheduler.sim.transform import GAVEL_THROUGHPUTS, assign_speeds

from .conftest import job

MIXED = parse_cluster("1x1xV100+1x1xK80")
V100, K80 = MIXED.nodes[0].name, MIXED.nodes[1].name
SPEEDS = (("K80", 0.25), ("V100", 1.0))


def finish_time(state: SimState) -> float:
    t = state.next_event_time()
    state.advance(t)
    return t


@pytest.mark.parametrize(("node", "expected"), [(V100, 100.0), (K80, 400.0)])
def test_a_job_runs_its_duration_divided_by_its_speed_on_the_model(node, expected) -> None:
    state = SimState([job(1, 0, 100, speeds=SPEEDS, time_limit=200)], MIXED, SimConfig())
    state.advance(0)
    assert state.start(1, node, (0,)) is None
    # The time limit stretches with the speed, as the policy sees it.
    assert state.running[1].time_limit == pytest.approx(200 * expected / 100)
    assert finish_time(state) == pytest.approx(expected)
    assert state.jobs[1].state == "done"


def test_a_job_without_speeds_runs_at_one_everywhere() -> None:
    state = SimState([job(1, 0, 100)], MIXED, SimConfig())
    state.advance(0)
    state.start(1, K80, (0,))
    assert finish_time(state) == 100.0


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        # 40 s on the K80 do 10 s of work; 90 s left on the V100 after a 60 s restart.
        (K80, V100, 50 + 60 + 90),
        # 40 s on the V100 do 40 s of work; the 60 s left take 240 s on the K80.
        (V100, K80, 50 + 60 + 240),
    ],
)
def test_checkpointed_progress_carries_over_to_another_model(first, second, expected) -> None:
    config = SimConfig(restart_overhead=60, checkpointing=True)
    state = SimState([job(1, 0, 100, speeds=SPEEDS, time_limit=1000)], MIXED, config)
    state.advance(0)
    state.start(1, first, (0,))
    state.advance(40)
    assert state.preempt(1) is None
    state.advance(50)
    assert state.start(1, second, (0,)) is None
    assert finish_time(state) == pytest.approx(expected)


def test_policies_see_declared_speeds_and_what_finished_jobs_teach() -> None:
    # Jobs of one class on each model, one at a time: the K80 runs take 4x as long against
    # the same limit, so the learned K80 speed is 0.25 once enough have finished.
    pairs = MIN_SAMPLES
    specs = [
        job(i, 0, 100, speeds=SPEEDS, name="train", time_limit=400, user="u")
        for i in range(1, 2 * pairs + 1)
    ]
    state = SimState(specs, MIXED, SimConfig())
    state.advance(0)
    assert dict(state.snapshot().pending[0].gpu_speeds) == dict(SPEEDS)
    for i in range(1, 2 * pairs + 1, 2):
        assert state.snapshot().gpu_speeds == {}
        state.start(i, V100, (0,))
        state.start(i + 1, K80, (0,))
        finish_time(state)
        finish_time(state)
    learned = state.snapshot().gpu_speeds
    assert learned["train"] == pytest.approx({"V100": 1.0, "K80": 0.25})
    hidden = SimState(specs, MIXED, SimConfig(declare_speeds=False))
    hidden.advance(0)
    assert hidden.snapshot().pending[0].gpu_speeds == ()


def test_speeds_are_read_from_csv_and_json_traces(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("submit,duration,gpus,team,speeds\n0,100,1,a,V100=1.0;K80=0.3\n5,100,1,a,\n")
    jobs = load_jobs(path)
    assert jobs[0].speeds == (("K80", 0.3), ("V100", 1.0))
    assert jobs[0].speed_on("K80") == 0.3 and jobs[0].speed_on("P100") == 1.0
    assert jobs[1].speeds == ()
    path.write_text("submit,duration,gpus,team,speeds\n0,100,1,a,V100=fast\n")
    with pytest.raises(ValueError, match="MODEL=SPEED"):
        load_jobs(path)
    json_path = tmp_path / "jobs.json"
    json_path.write_text('[{"submit": 0, "duration": 10, "gpus": 1, "speeds": {"K80": 0.5}}]')
    assert load_jobs(json_path)[0].speeds == (("K80", 0.5),)


def test_assigned_speeds_follow_the_table_and_the_seed() -> None:
    jobs = [job(i, 0, 100) for i in range(1, 301)]
    drawn = assign_speeds(jobs, seed=3)
    assert drawn == assign_speeds(jobs, seed=3)
    assert [j.name for j in drawn] != [j.name for j in assign_speeds(jobs, seed=4)]
    assert {j.name for j in drawn} == set(GAVEL_THROUGHPUTS)
    lm = next(j for j in drawn if j.name == "LM")
    assert lm.speed_on("V100") == 1.0
    assert lm.speed_on("K80") == pytest.approx(1.5766 / 96.2464, abs=1e-4)
    assert all(j.duration == 100 for j in drawn)
