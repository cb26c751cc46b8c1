import json

import numpy as np
import pytest

from scheduler.sim.jobs import COMMON_LIMITS, assign_time_limits, round_up_limit
from scheduler.sim.sources import load_jobs, load_philly, synthetic
from scheduler.sim.transform import offered_load, prepare, select_window

from .conftest import job


def test_philly_sample_loads_sorted_with_teams_as_users(sample_path):
    jobs = load_philly(sample_path)
    assert len(jobs) == 300
    assert [j.id for j in jobs] == list(range(1, 301))
    assert jobs[0].submit == 0.0
    assert all(a.submit <= b.submit for a, b in zip(jobs, jobs[1:], strict=False))
    assert all(j.user == j.team for j in jobs)
    assert sum(j.gpus > 8 for j in jobs) == 3
    assert load_jobs(sample_path) == jobs  # auto-detects the Philly header


def test_generic_csv_and_json_agree(tmp_path):
    rows = [
        {"submit": 30, "duration": 100, "gpus": 2, "team": "nlp", "user": "ann", "name": "bert"},
        {
            "submit": 0,
            "duration": 50,
            "gpus": 1,
            "team": "cv",
            "user": "bob",
            "name": "r50",
            "time_limit": 3600,
            "gpu_model": "A100",
        },
    ]
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": rows}))
    header = "submit,duration,gpus,team,user,name,time_limit,gpu_model\n"
    body = "30,100,2,nlp,ann,bert,,\n0,50,1,cv,bob,r50,3600,A100\n"
    (tmp_path / "jobs.csv").write_text(header + body)
    from_json = load_jobs(tmp_path / "jobs.json")
    from_csv = load_jobs(tmp_path / "jobs.csv")
    assert from_json == from_csv
    first, second = from_json
    assert (first.user, first.time_limit, first.gpu_model) == ("bob", 3600.0, "A100")
    assert (second.submit, second.gpus, second.time_limit) == (30.0, 2, None)


def test_generic_row_without_duration_is_refused(tmp_path):
    (tmp_path / "bad.csv").write_text("submit,gpus\n0,1\n")
    with pytest.raises(ValueError, match="row 1"):
        load_jobs(tmp_path / "bad.csv")


def test_time_limits_over_ask_never_under_ask_and_are_common_values():
    jobs = [job(i, 0, d, time_limit=None) for i, d in enumerate([5, 70, 1144, 5000, 90000], 1)]
    limited = assign_time_limits(jobs * 40, seed=3)
    for j in limited:
        assert j.time_limit >= j.duration
        assert j.time_limit in COMMON_LIMITS or j.time_limit % 86400 == 0
    factors = [j.time_limit / j.duration for j in limited if j.duration == 1144]
    assert 1.5 < float(np.median(factors)) < 3.5  # median over-ask about 2x, after rounding
    assert assign_time_limits(jobs, seed=3) == assign_time_limits(jobs, seed=3)
    assert assign_time_limits(jobs, seed=3) != assign_time_limits(jobs, seed=4)


def test_round_up_limit_past_thirty_days_is_whole_days():
    assert round_up_limit(61) == 300
    assert round_up_limit(3600) == 3600
    assert round_up_limit(40 * 86400 + 1) == 41 * 86400


def test_prepare_drops_or_splits_jobs_larger_than_a_node(sample_path):
    raw = load_philly(sample_path)
    dropped, rep = prepare(raw, total_gpus=64, max_node_gpus=8, oversize="drop")
    assert rep.dropped_oversize == 3 and len(dropped) == 297
    split, rep2 = prepare(raw, total_gpus=64, max_node_gpus=8, oversize="split")
    assert rep2.split_oversize == 3
    big = sum(j.gpus for j in raw if j.gpus > 8)
    assert sum(j.gpus for j in split) == sum(j.gpus for j in dropped) + big
    assert max(j.gpus for j in split) == 8


def test_prepare_scales_arrivals_to_the_target_load(sample_path):
    raw = load_philly(sample_path)
    jobs, rep = prepare(raw, total_gpus=64, max_node_gpus=8, window="10:210", load=0.9)
    assert len(jobs) == 200 and jobs[0].submit == 0.0
    assert offered_load(jobs, 64) == pytest.approx(0.9)
    assert rep.offered_load == pytest.approx(0.9)
    assert [j.id for j in jobs] == list(range(1, 201))


def test_time_window_selects_by_submit_time():
    jobs = [job(i, t, 10) for i, t in enumerate([0, 100, 3600, 7200, 90000], 1)]
    assert [j.id for j in select_window(jobs, "1m:2h")] == [2, 3]
    assert [j.id for j in select_window(jobs, "1:3")] == [2, 3]
    assert [j.id for j in select_window(jobs, "1d:")] == [5]


def test_synthetic_jobs_offer_the_requested_load():
    jobs = synthetic(3000, total_gpus=64, load=0.7, seed=1)
    assert len(jobs) == 3000 and max(j.gpus for j in jobs) <= 8
    assert offered_load(jobs, 64) == pytest.approx(0.7, rel=0.25)  # Poisson noise
    assert synthetic(50, total_gpus=64, seed=1) == synthetic(50, total_gpus=64, seed=1)
