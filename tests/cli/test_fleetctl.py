"""fleetctl end to end: the installed console script against a live fleet server."""

from __future__ import annotations

import csv
import io
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from fleet.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _nodes(fleet_nodes: Any) -> None:
    """sim-a (4 A100-80GB) and sim-b (2 V100-32GB)."""


def _submit(fleetctl: Any, token: str, *args: str) -> int:
    result = fleetctl("submit", "--json", *args, token=token)
    assert result.rc == 0, result.err
    return int(result.json()["id"])


def test_submit_then_show_ls_and_cancel(fleetctl: Any, tokens: dict[str, str]) -> None:
    token = tokens["owner"]
    result = fleetctl(
        "submit", "--gpus", "2", "--time", "0-20:30", "--priority", "5", "--preemptible",
        "--name", "train-resnet", "--env", "LR=0.1", "--env", "EMPTY=", "--gpu-mem", "40G",
        "--", "python", "train.py", "--epochs", "3", token=token,
    )  # fmt: skip
    assert result.rc == 0, result.err
    assert result.out.startswith("Submitted job ")
    job_id = int(result.out.split()[-1])
    job = Job.objects.get(pk=job_id)
    assert (job.name, job.gpus, job.time_limit, job.priority, job.preemptible) == (
        "train-resnet", 2, 20 * 3600 + 30 * 60, 5, True,
    )  # fmt: skip
    assert job.command == "python train.py --epochs 3"
    assert job.env == {"LR": "0.1", "EMPTY": ""}
    assert job.min_gpu_memory_mb == 40 * 1024
    assert (job.owner.username, job.team.slug, job.state) == ("owner", "vision", "pending")

    shown = fleetctl("show", str(job_id), "--json", token=token)
    assert shown.rc == 0 and shown.json()["name"] == "train-resnet"
    text = fleetctl("show", str(job_id), token=token)
    assert "train-resnet" in text.out and "pending" in text.out

    listed = fleetctl("ls", token=token)
    assert listed.rc == 0
    head, *rows = listed.out.splitlines()
    assert head.split()[:3] == ["JOBID", "POS", "NAME"]
    assert [r.split()[0] for r in rows] == [str(job_id)]
    assert rows[0].split()[5] == "PD"
    queue = fleetctl("--json", "squeue", token=token).json()
    assert [j["id"] for j in queue["pending"]] == [job_id]

    cancelled = fleetctl("cancel", str(job_id), "--reason", "wrong data", token=token)
    assert cancelled.rc == 0 and cancelled.out.strip() == f"job {job_id}: cancelled"
    Job.objects.get(pk=job_id, state="cancelled")
    # Cancelling again is refused, with the API's sentence.
    again = fleetctl("cancel", str(job_id), token=token)
    assert again.rc == 1
    assert f"Job {job_id} is cancelled; cancel applies only to" in again.err


def test_hold_release_and_fraction(fleetctl: Any, tokens: dict[str, str]) -> None:
    token = tokens["owner"]
    job_id = _submit(fleetctl, token, "--gpu-share", "25", "--gpu-mem", "8G", "--time", "30m",
                     "--", "sleep 60")  # fmt: skip
    job = Job.objects.get(pk=job_id)
    assert (job.gpus, job.gpu_compute_percent, job.gpu_memory_mb, job.time_limit) == (
        0, 25, 8192, 1800
    )  # fmt: skip
    assert job.command == "sleep 60" and job.name == "sleep"
    held = fleetctl("hold", str(job_id), "--json", token=token)
    assert held.rc == 0 and held.json()[0]["state"] == "held"
    assert fleetctl("release", str(job_id), token=token).out.strip() == f"job {job_id}: pending"
    assert fleetctl("release", str(job_id), token=token).rc == 1
    logs = fleetctl("logs", str(job_id), token=token)
    assert (logs.rc, logs.out) == (0, "")


def test_bad_input_exit_codes(fleetctl: Any, tokens: dict[str, str], live_server: Any) -> None:
    token = tokens["owner"]
    # Usage errors (2) are caught before anything is sent.
    for args in (["--time", "soon"], ["--mem", "lots"], ["--env", "NOEQUALS"], []):
        result = (
            fleetctl("submit", *args, "--", "true", token=token)
            if args
            else fleetctl("submit", token=token)
        )
        assert result.rc == 2, (args, result.err)
        assert result.err.startswith("fleetctl submit: ") or "usage:" in result.err
    assert "Cannot read time limit 'soon'" in fleetctl("submit", "-t", "soon", "--", "x",
                                                       token=token).err  # fmt: skip
    assert fleetctl("show", "not-a-number", token=token).rc == 2
    assert fleetctl("frobnicate", token=token).rc == 2
    assert Job.objects.count() == 0
    # The API refuses (1): its sentence, naming the field.
    too_many = fleetctl("submit", "--gpus", "2000", "--", "true", token=token)
    assert too_many.rc == 1 and "gpus" in too_many.err
    wrong_team = fleetctl("submit", "--team", "speech", "--", "true", token=token)
    assert wrong_team.rc == 1
    assert "You are not a member of team 'speech'" in wrong_team.err
    assert fleetctl("show", "999999", token=token).rc == 1
    assert Job.objects.count() == 0
    # No server, no token, a wrong token (3).
    gone = fleetctl("ls", token=token, url="http://127.0.0.1:9")
    assert gone.rc == 3 and "Cannot reach fleet at http://127.0.0.1:9" in gone.err
    assert fleetctl("ls", url="").rc == 3
    bad = fleetctl("ls", token="not-a-token")
    assert bad.rc == 3 and "did not accept the token" in bad.err


def test_another_team_cannot_see_or_cancel(fleetctl: Any, tokens: dict[str, str]) -> None:
    job_id = _submit(fleetctl, tokens["owner"], "--env", "SECRET=hunter2", "--",
                     "python", "/data/vision/train.py")  # fmt: skip
    outsider = tokens["outsider"]
    # Other teams see a job's metadata (the queue is shared), never its command or env.
    shown = fleetctl("show", str(job_id), "--json", token=outsider)
    assert shown.rc == 0
    assert (shown.json()["command"], shown.json()["env"], shown.json()["can_manage"]) == (
        None, None, False
    )  # fmt: skip
    text = fleetctl("show", str(job_id), token=outsider).out
    assert "train.py" not in text and "hunter2" not in text
    for action in ("cancel", "hold"):
        refused = fleetctl(action, str(job_id), token=outsider)
        assert refused.rc == 1 and refused.err.startswith(f"fleetctl {action}: ")
    assert Job.objects.get(pk=job_id).state == "pending"
    mine = fleetctl("ls", "--mine", "--json", token=outsider).json()
    assert mine["pending"] == []
    # A teammate sees it; staff may cancel it.
    assert fleetctl("show", str(job_id), token=tokens["teammate"]).rc == 0
    assert fleetctl("cancel", str(job_id), token=tokens["staff"]).rc == 0


def test_login_writes_a_private_config(fleetctl: Any, tokens: dict[str, str], live_server: Any,
                                       tmp_path: Path) -> None:  # fmt: skip
    result = fleetctl("login", "--url", live_server.url + "/api/v1/", token=None,
                      stdin=tokens["owner"] + "\n")  # fmt: skip
    assert result.rc == 0, result.err
    assert "as owner" in result.out
    config = tmp_path / "fleet" / "config"
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600
    assert tokens["owner"] in config.read_text()
    # Without FLEET_URL and FLEET_TOKEN, the saved ones are used.
    assert fleetctl("ls", "--json", url="").rc == 0
    refused = fleetctl("login", "--url", live_server.url, "--token", "wrong")
    assert refused.rc == 3
    assert tokens["owner"] in config.read_text()  # a failed login keeps the old config


def test_nodes_estimate_and_usage(fleetctl: Any, tokens: dict[str, str]) -> None:
    token = tokens["owner"]
    nodes = fleetctl("nodes", token=token)
    assert nodes.rc == 0
    assert {line.split()[0] for line in nodes.out.splitlines()[1:]} == {"sim-a", "sim-b"}
    assert {n["name"] for n in fleetctl("sinfo", "--json", token=token).json()} == {
        "sim-a", "sim-b"
    }  # fmt: skip
    estimate = fleetctl("estimate", "--gpus", "2", "--json", "--", "true", token=token)
    assert estimate.rc == 0 and "would_start_now" in estimate.json()
    assert fleetctl("estimate", "--gpus", "64", "--", "true", token=token).rc == 1
    usage = fleetctl("usage", "--by", "user", "--csv", token=token)
    assert usage.rc == 0
    assert next(csv.reader(io.StringIO(usage.out)))[:2] == ["Account", "User"]
    bad = fleetctl("usage", "--since", "last tuesday", token=token)
    assert bad.rc == 1 and "since" in bad.err
