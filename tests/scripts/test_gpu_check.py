"""scripts/gpu_check.py, the pre-join check of a GPU host, on the simulated backend (the
NVML path is the same runtime with the other backend): a real job runs, its process shows
in telemetry, and the exit status follows the job's outcome."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), "--simulate", "1xH100-80GB", "--interval", "0.2", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_job_that_succeeds_is_seen_on_the_gpu_and_its_log_printed() -> None:
    out = check("--command", "echo checked-on-the-gpu; sleep 1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert '"model": "H100-80GB"' in out.stdout
    assert '"job_id": 1' in out.stdout  # a telemetry sample named the job's process
    assert "(1, 1, 'succeeded', 0)" in out.stdout
    assert "checked-on-the-gpu" in out.stdout


def test_a_failing_job_makes_the_check_fail() -> None:
    out = check("--command", "echo broken; exit 3")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "(1, 1, 'failed', 3)" in out.stdout


def test_gpus_that_cannot_be_read_give_a_reason_and_status_2() -> None:
    out = subprocess.run(
        [sys.executable, str(CHECK), "--simulate", "3xNoSuchGPU"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("gpu_check: ")
    assert "Traceback" not in out.stderr
