"""scripts/supervise.sh, which `make up` runs every process under: a process that exits
(beat after a database outage, a killed agent) is started again; SIGTERM stops both."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import psutil

SUPERVISE = Path(__file__).resolve().parents[2] / "scripts" / "supervise.sh"


def wait_for(check, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_an_exited_process_is_started_again_and_sigterm_stops_both(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    script = f"echo run >> {runs}; [ $(wc -l < {runs}) -ge 2 ] && exec sleep 60; exit 3"
    sup = subprocess.Popen([str(SUPERVISE), "sh", "-c", script], stderr=subprocess.PIPE)
    try:
        wait_for(lambda: runs.exists() and runs.read_text().count("run") == 2)
        wait_for(lambda: any(c.name() == "sleep" for c in psutil.Process(sup.pid).children(True)))
        child = psutil.Process(sup.pid).children(recursive=True)[0]
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=10) == 0
        wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE)
        assert sup.stderr is not None
        assert "exited with status 3; starting it again in 1 s" in sup.stderr.read().decode()
    finally:
        if sup.poll() is None:
            sup.kill()
