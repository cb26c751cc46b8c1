"""The command line on the committed Philly sample, as a user would call it."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

METRICS = (
    "jct_avg",
    "jct_p50",
    "jct_p95",
    "jct_p99",
    "queue_avg",
    "queue_p50",
    "queue_p95",
    "queue_p99",
    "makespan",
    "utilization",
    "preemptions",
    "lost_gpu_seconds",
    "jain_slowdown",
    "ftf_rho_avg",
    "ftf_rho_max",
    "prediction_mare",
    "bound_jct_avg",
    "bound_makespan",
    "jct_vs_bound",
    "makespan_vs_bound",
)


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "scheduler.sim", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_json_output_has_every_metric_and_oracle_ratios(sample_path, tmp_path):
    html = tmp_path / "report.html"
    proc = cli(
        "--trace",
        str(sample_path),
        "--format",
        "philly",
        "--cluster",
        "2x8xV100",
        "--policy",
        "fcfs,sjf,srpt-oracle",
        "--load",
        "0.8",
        "--seed",
        "3",
        "--json",
        "--html",
        str(html),
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["prep"]["dropped_unfit"] == 3 and data["prep"]["kept"] == 297
    for name in ("fcfs", "sjf", "srpt-oracle"):
        m = data["policies"][name]
        missing = [k for k in METRICS if k not in m]
        assert not missing, (name, missing)
        assert m["finished"] == 297
        assert m["jct_vs_bound"] >= 1.0
        assert set(m["vs_oracle"]) >= {"jct_avg", "makespan"}
    assert data["policies"]["srpt-oracle"]["vs_oracle"]["jct_avg"] == 1.0
    assert data["policies"]["fcfs"]["prediction_mare"] is not None
    page = html.read_text()
    assert "JCT CDF" in page and "Queue length" in page and "plotly" in page.lower()
    # Self-contained: plotly.js is inlined (megabytes), no script is fetched from a CDN.
    assert 'src="http' not in page and len(page) > 1_000_000


def test_table_output_and_window(sample_path):
    proc = cli("--trace", str(sample_path), "--policy", "fcfs", "--window", "0:50", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("policy")
    assert "fcfs" in proc.stdout


def test_bad_cluster_and_policy_are_explained(sample_path):
    proc = cli("--trace", str(sample_path), "--cluster", "8x8", "--quiet")
    assert proc.returncode != 0 and "NODESxGPUSxMODEL" in proc.stderr
    proc = cli("--trace", str(sample_path), "--policy", "nope", "--quiet")
    assert proc.returncode != 0 and "unknown policy nope" in proc.stderr


def test_jobs_over_a_node_run_as_gangs_and_only_unfit_ones_are_dropped(sample_path):
    args = ("--trace", str(sample_path), "--policy", "fcfs", "--json", "--quiet")
    proc = cli(*args, "--cluster", "4x8xV100[cpus=64,mem=512]", "--nodes-per-group", "2")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["prep"]["ganged"] == 3 and data["prep"]["dropped_unfit"] == 0
    m = data["policies"]["fcfs"]
    assert m["finished"] == 300 and m["gangs"] == 3 and m["invalid_decisions"] == 0
    for key in ("preemptions_per_job", "lost_gpu_hours", "gang_wait_share", "gang_jct_avg"):
        assert m[key] is not None, key
    # A member of 8 GPUs asks 8 x 4 = 32 CPUs by default: a 16-CPU node can never hold one,
    # so the 3 gangs and the 27 jobs of 8 GPUs are dropped.
    small = cli(*args, "--cluster", "4x8xV100[cpus=16]")
    assert json.loads(small.stdout)["prep"]["dropped_unfit"] == 3 + 27
    bad = cli(*args, "--cluster", "4x8xV100[cpus=lots]")
    assert bad.returncode != 0 and "cpus" in bad.stderr
