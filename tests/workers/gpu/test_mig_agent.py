"""MIG end to end: a real agent process reads a host whose second GPU is in MIG mode through
NVML (the pynvml stand-in, put first on the agent's import path; NVML cannot run here),
registers each MIG device as a GPU, and a job asking for the slice's model is placed on one
by the scheduling cycle and runs with CUDA_VISIBLE_DEVICES naming its MIG UUID."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache

from fleet.models import Gpu, Job, JobLogChunk
from fleet.services.telemetry import LATEST_KEY
from scheduler.cycle.runner import run_cycle
from tests.factories import JobFactory
from tests.workers.agent_harness import ControlPump
from tests.workers.conftest import StartAgent

pytestmark = pytest.mark.django_db

HOST = '''"""pynvml for the agent under test: an A100 used whole, and an A100 in MIG mode with
two 3g.40gb MIG devices."""
import sys

from tests.workers.gpu import fake_pynvml
from tests.workers.gpu.fake_pynvml import FakeDevice, FakeMigDevice


def _slice(uuid):
    return FakeMigDevice(
        name="NVIDIA A100-SXM4-80GB MIG 3g.40gb", uuid=uuid, total_mb=40192, used_mb=512,
        gi_slices=3, ci_slices=3,
    )


sys.modules[__name__] = fake_pynvml.make_module([
    FakeDevice(name="NVIDIA A100-SXM4-80GB", uuid="GPU-e2e-a0", total_mb=81920, used_mb=0),
    FakeDevice(
        name="NVIDIA A100-SXM4-80GB", uuid="GPU-e2e-a1", total_mb=81920, used_mb=1024,
        mig_mode=1, mig_slots=[_slice("MIG-e2e-1111"), _slice("MIG-e2e-2222")],
    ),
])
'''


def test_a_job_asking_for_a_mig_model_runs_on_a_mig_device_of_a_real_agent(
    agents: StartAgent, control: ControlPump, owner: Any, team: Any, tmp_path: Path
) -> None:
    fake = tmp_path / "nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(HOST)
    node, agent = agents(simulate="", env={"PYTHONPATH": str(fake), "FLEET_SIMULATE_GPUS": ""})

    gpus = list(Gpu.objects.filter(node=node).order_by("index"))
    assert [(g.index, g.uuid, g.model, g.memory_mb) for g in gpus] == [
        (0, "GPU-e2e-a0", "A100-80GB", 81920),
        (10, "MIG-e2e-1111", "A100-80GB MIG 3g.40gb", 40192),
        (11, "MIG-e2e-2222", "A100-80GB MIG 3g.40gb", 40192),
    ], agent.output()
    assert node.gpu_backend == "nvml"

    job: Job = JobFactory(  # type: ignore[assignment]
        owner=owner,
        team=team,
        gpu_model="A100-80GB MIG 3g.40gb",
        command='echo "devices=$CUDA_VISIBLE_DEVICES"',
    )
    record = control.run(run_cycle)
    assert record is not None and record.placed == 1
    placed = Job.objects.get(pk=job.pk)
    assert placed.node_id == node.pk and placed.gpu_indices in ([10], [11])

    done = control.pump(
        lambda: Job.objects.filter(pk=job.pk, state__in=("succeeded", "failed")).first(),
        what="the job to end",
    )
    assert done.state == "succeeded", agent.output()
    uuid = {10: "MIG-e2e-1111", 11: "MIG-e2e-2222"}[placed.gpu_indices[0]]

    def output() -> str | None:
        chunks = JobLogChunk.objects.filter(job=job).order_by("offset")
        text = b"".join(bytes(c.data) for c in chunks).decode()
        return text if "devices=" in text else None

    assert control.pump(output, what="the job's output") == f"devices={uuid}\n"

    # Its telemetry reaches the control side: own memory, utilization unknown (not 0).
    latest = control.pump(
        lambda: cache.get(LATEST_KEY.format(uuid="MIG-e2e-2222")), what="a MIG device's sample"
    )
    assert (latest["memory_total_mb"], latest["memory_used_mb"]) == (40192, 512)
    assert latest["util_percent"] is None
