"""The fleet trace: written from recorded jobs, read back by `python -m scheduler.sim`, and
replayed by the advisor with non-preemptible jobs honoured."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.advisor.evaluate import evaluate
from scheduler.advisor.grid import GRID, Candidate, candidates
from scheduler.advisor.records import RecordedJob, actual_metrics, trace_rows
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.sources import FLEET_COLUMNS, fleet_jobs, load_fleet, load_jobs

ROOT = Path(__file__).resolve().parents[3]
T0 = 1_780_000_000.0


def recorded(id: int, submit: float, start: float, end: float, **kw) -> RecordedJob:
    kw.setdefault("team", "vision")
    kw.setdefault("user", "ann")
    kw.setdefault("gpus", 1)
    kw.setdefault("time_limit", 3600.0)
    kw.setdefault("state", "succeeded")
    return RecordedJob(
        id=id, name=f"job{id}", submit=T0 + submit, runs=((T0 + start, T0 + end),), **kw
    )


def write(path: Path, jobs: list[RecordedJob]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FLEET_COLUMNS)
        writer.writeheader()
        writer.writerows(trace_rows(jobs))
    return path


def sim(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.sim", *args, "--json", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_simulator_cli_replays_a_fleet_trace(tmp_path):
    # One GPU; under fcfs B waits for A: A runs 0-100, B 100-150 (submitted at 10).
    trace = write(
        tmp_path / "fleet.csv",
        [recorded(2, 10, 10, 60, user="bob"), recorded(1, 0, 0, 100)],
    )
    out = sim(
        "--trace", str(trace), "--cluster", "1x1xA100-80GB", "--policy", "fcfs",
        "--cpus-per-gpu", "0", "--memory-gb-per-gpu", "0",
    )  # fmt: skip
    m = out["policies"]["fcfs"]
    assert out["prep"]["loaded"] == 2
    assert m["finished"] == 2
    assert m["queue_avg"] == pytest.approx(45.0)  # (0 + 90) / 2
    assert m["jct_avg"] == pytest.approx(120.0)  # (100 + 140) / 2


def test_reader_keeps_the_request_and_names_the_fixed_jobs(tmp_path):
    gang = recorded(
        7, 5, 6, 506, gpus=16, gpus_per_node=8, gpu_model="A100-80GB", cpus=32,
        memory_mb=65536, priority=3, preemptible=True,
    )  # fmt: skip
    fixed = recorded(3, 0, 1, 31, preemptible=False)
    path = write(tmp_path / "t.csv", [gang, fixed])
    jobs, fixed_ids = load_fleet(path)
    assert load_jobs(path) == jobs  # the header is recognised as a fleet trace
    first, second = jobs
    assert (first.name, first.submit, first.duration, first.gpus) == ("job3", 0.0, 30.0, 1)
    assert fixed_ids == frozenset({1})
    assert (second.gpus, second.gpus_per_node, second.nodes) == (16, 8, 2)
    assert (second.gpu_model, second.cpus, second.memory_mb) == ("A100-80GB", 32, 65536)
    assert (second.priority, second.time_limit, second.submit) == (3, 3600.0, 5.0)


def test_reader_refuses_a_gang_whose_nodes_do_not_add_up():
    rows = trace_rows([recorded(1, 0, 0, 10, gpus=16, gpus_per_node=8)])
    rows[0]["nodes"] = "3"
    with pytest.raises(ValueError, match="row 1: 3 nodes of 8 GPUs do not make 16 GPUs"):
        fleet_jobs(rows)


def test_actual_metrics_by_hand():
    jobs = [
        # vision: waited 0 and 90 s; runtimes 100 and 50.
        recorded(1, 0, 0, 100),
        recorded(2, 10, 100, 150),
        # speech: 2 GPUs, preempted once after 20 s, then ran 30 s.
        RecordedJob(
            id=3, name="j3", submit=T0, team="speech", user="cy", gpus=2, time_limit=600.0,
            state="succeeded", runs=((T0 + 0, T0 + 20), (T0 + 40, T0 + 70)), preemptions=1,
        ),
    ]  # fmt: skip
    m = actual_metrics(jobs, total_gpus=4)
    assert m.wait_avg == pytest.approx((0 + 90 + 0) / 3)
    assert m.jct_avg == pytest.approx((100 + 140 + 70) / 3)
    # GPU-seconds held: 100 + 50 + 2 x (20 + 30) = 250, over 4 GPUs x 150 s.
    assert m.utilization == pytest.approx(250 / 600)
    # Slowdowns: vision 1 and 140/50 = 2.8 (avg 1.9); speech 70/30.
    assert m.team_slowdown == pytest.approx({"vision": 1.9, "speech": 70 / 30})
    x, y = 1.9, 70 / 30
    assert m.fairness_jain == pytest.approx((x + y) ** 2 / (2 * (x * x + y * y)))
    assert m.preemptions_per_job == pytest.approx(1 / 3)


def test_non_preemptible_jobs_are_never_preempted_in_the_replay():
    # Team "big" fills the one node; "small" is guaranteed the GPUs and arrives later. With
    # reclaim on, fcfs preempts big's job only if that job may be preempted.
    def rows(preemptible: bool) -> list[dict[str, str]]:
        return trace_rows(
            [
                recorded(1, 0, 0, 1000, gpus=2, team="big", preemptible=preemptible),
                recorded(2, 10, 1000, 1100, gpus=2, team="small"),
            ]
        )

    cluster = parse_cluster("1x2xA100-80GB")
    runs = {}
    for preemptible in (True, False):
        (entry,) = evaluate(
            rows(preemptible),
            cluster,
            [Candidate("fcfs")],
            settings={"preemption": True},
            guarantees={"small": 2},
        )
        runs[preemptible] = entry["metrics"]
    assert runs[True]["preemptions_per_job"] > 0
    assert runs[False]["preemptions_per_job"] == 0
    assert runs[False]["wait_avg"] == pytest.approx((0 + 990) / 2)


def test_grid_keeps_every_policy_and_only_known_keys():
    known = {k for params in GRID.values() for p in params for k in p} - {"las_preemption"}
    cands = candidates(["fcfs", "las", "newpolicy", "priority"], known, cap=6)
    names = [c.policy for c in cands]
    assert len(cands) == 6
    assert names.count("fcfs") == 2 and names.count("priority") == 2
    assert {"las", "newpolicy"} <= set(names)
    assert all("las_preemption" not in c.params for c in cands)


def test_candidates_past_the_time_budget_are_reported_not_simulated():
    rows = trace_rows([recorded(1, 0, 0, 100)])
    seen: list[int] = []
    out = evaluate(
        rows,
        parse_cluster("1x1xA100-80GB"),
        [Candidate("fcfs"), Candidate("sjf")],
        settings={},
        guarantees={},
        progress=seen.append,
        budget=0.0,
    )
    assert seen == [1, 2]
    assert all(e["error"].startswith("Not simulated: the run used its 0 minutes") for e in out)
    assert all("metrics" not in e for e in out)
