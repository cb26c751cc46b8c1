"""fleetctl end to end: the installed console script against a live fleet server."""

from __future__ import annotations

import csv
import io
import os
import stat
import subprocess
import time
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


def test_multi_node_and_host_resources(fleetctl: Any, tokens: dict[str, str]) -> None:
    job_id = _submit(fleetctl, tokens["owner"], "--nodes", "2", "--gpus-per-node", "2",
                     "--cpus", "4", "--mem", "8G", "--same-group", "--", "torchrun", "t.py")  # fmt: skip
    job = Job.objects.get(pk=job_id)
    assert (job.gpus, job.gpus_per_node, job.cpus, job.memory_mb, job.same_group) == (
        4, 2, 4, 8192, True
    )  # fmt: skip
    # The API's own sentence when the options do not fit together.
    clash = fleetctl("submit", "--nodes", "2", "--", "true", token=tokens["owner"])
    assert clash.rc == 1 and "nodes needs gpus_per_node" in clash.err


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
    # Without a command: the sentence names the subcommand that was run.
    bare = fleetctl("estimate", "--gpus", "2", token=token)
    assert bare.rc == 2 and "e.g. fleetctl estimate --gpus 1 -- python" in bare.err
    usage = fleetctl("usage", "--by", "user", "--csv", token=token)
    assert usage.rc == 0
    assert next(csv.reader(io.StringIO(usage.out)))[:2] == ["Account", "User"]
    bad = fleetctl("usage", "--since", "last tuesday", token=token)
    assert bad.rc == 1 and "since" in bad.err


def test_logs_follow_until_the_job_ends(
    fleetctl: Any, tokens: dict[str, str], live_server: Any, tmp_path: Path, fleet_nodes: Any
) -> None:
    from fleet.models import JobLogChunk
    from fleet.services.job_states import SCHEDULER, Actor, job_transition
    from tests.cli.conftest import FLEETCTL

    job_id = _submit(fleetctl, tokens["owner"], "--", "python", "train.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(FLEET_URL=live_server.url, FLEET_TOKEN=tokens["owner"],
               FLEET_CONFIG=str(tmp_path / "none"))  # fmt: skip
    follow = subprocess.Popen([str(FLEETCTL), "logs", "-f", str(job_id)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        time.sleep(1.5)
        assert follow.poll() is None  # pending: nothing yet, and it keeps waiting
        node = Actor.node("sim-a")
        job_transition(job_id=job_id, action="dispatch", actor=SCHEDULER,
                       fields={"node": fleet_nodes[0], "gpu_indices": [0]})  # fmt: skip
        job_transition(job_id=job_id, action="start", actor=node)
        first, second = b"epoch 1 loss 0.9\n", b"epoch 2 loss 0.5\n"
        JobLogChunk.objects.create(job_id=job_id, attempt=1, offset=0, end=len(first),
                                   data=first)  # fmt: skip
        time.sleep(2.0)
        assert follow.poll() is None  # running: it follows
        JobLogChunk.objects.create(job_id=job_id, attempt=1, offset=len(first),
                                   end=len(first) + len(second), data=second, eof=True)  # fmt: skip
        job_transition(job_id=job_id, action="succeed", actor=node)
        out, err = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 0, err
    assert out == (first + second).decode()
    # Without -f, the whole output at once.
    assert fleetctl("logs", str(job_id), token=tokens["owner"]).out == out
