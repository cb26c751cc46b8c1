"""The simulator's checkpoint model follows what each job declares: a trace's `checkpointed`
column decides per job whether a preemption keeps its progress; an empty cell leaves it to
the run's --checkpointing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.sim.cluster import parse_cluster
from scheduler.sim.sources import load_jobs
from scheduler.sim.state import SimConfig, SimState

from .conftest import job

ONE_GPU = parse_cluster("1x1xV100")


def preempted_once(spec_kw: dict, config: SimConfig) -> tuple[float, float]:
    """Run 30 s of a 100 s job, preempt it, restart at 40 s: (finish, lost GPU-seconds)."""
    state = SimState([job(1, 0, 100, **spec_kw)], ONE_GPU, config)
    node = ONE_GPU.nodes[0].name
    state.advance(0)
    state.start(1, node, (0,))
    state.advance(30)
    assert state.preempt(1) is None
    state.advance(40)
    state.start(1, node, (0,))
    finish = state.next_event_time()
    assert finish is not None
    state.advance(finish)
    return finish, state.jobs[1].lost_gpu_seconds


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_job_that_declares_checkpoints_keeps_its_progress_whatever_the_run_says(
    checkpointing: bool,
) -> None:
    config = SimConfig(restart_overhead=60, checkpointing=checkpointing)
    # 30 s kept: restart at 40 + 60 overhead + 70 left = 170; only the overhead is lost.
    assert preempted_once({"checkpointed": True}, config) == (170, 60)
    # Nothing kept: 40 + 60 + 100 = 200; the 30 s run and the overhead are lost.
    assert preempted_once({"checkpointed": False}, config) == (200, 90)


def test_an_undeclared_job_follows_the_run() -> None:
    assert preempted_once({}, SimConfig(restart_overhead=60, checkpointing=True)) == (170, 60)
    assert preempted_once({}, SimConfig(restart_overhead=60, checkpointing=False)) == (200, 90)


def test_the_column_is_read_from_csv_and_json_traces(tmp_path: Path) -> None:
    csv_path = tmp_path / "jobs.csv"
    csv_path.write_text(
        "submit,duration,gpus,team,checkpointed\n"
        "0,100,1,a,true\n10,100,1,a,0\n20,100,1,a,\n30,100,1,a,yes\n"
    )
    assert [j.checkpointed for j in load_jobs(csv_path)] == [True, False, None, True]
    json_path = tmp_path / "jobs.json"
    json_path.write_text(
        json.dumps(
            [
                {"submit": 0, "duration": 5, "gpus": 1, "checkpointed": False},
                {"submit": 1, "duration": 5, "gpus": 1},
            ]
        )  # fmt: skip
    )
    assert [j.checkpointed for j in load_jobs(json_path)] == [False, None]


def test_a_bad_value_names_its_row(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("submit,duration,gpus,checkpointed\n0,100,1,true\n5,100,1,sometimes\n")
    with pytest.raises(ValueError, match=r"row 2: checkpointed='sometimes'; give true or false"):
        load_jobs(path)
