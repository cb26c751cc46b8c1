"""The environment of a job placed on a MIG device: CUDA_VISIBLE_DEVICES names the device
by its MIG UUID, and no MPS limits are set for it (the slice is the share)."""

import sys
from pathlib import Path

from tests.workers.executor.helpers import Agent
from tests.workers.gpu import fake_pynvml
from tests.workers.gpu.fake_pynvml import FakeDevice, FakeMigDevice
from workers.executor import JobSpec, job_environment
from workers.executor.mps import Mps
from workers.gpu import NvmlBackend

MPS = Mps("/var/run/nvidia-mps", log_directory="/var/log/nvidia-mps")
MIG = {11: "MIG-4f1e2d3c-aaaa-bbbb-cccc-000000000011"}


def spec(**kw):
    return JobSpec(job_id=7, attempt=1, command="true", log_path="/dev/null", **kw)


def test_a_job_on_a_mig_device_sees_it_by_its_mig_uuid():
    env = job_environment(spec(gpu_indices=(11,)), {}, mps=MPS, mig_devices=MIG)

    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-4f1e2d3c-aaaa-bbbb-cccc-000000000011"


def test_whole_gpus_keep_their_index_on_a_host_with_mig_devices():
    env = job_environment(spec(gpu_indices=(0, 2)), {}, mps=MPS, mig_devices=MIG)

    assert env["CUDA_VISIBLE_DEVICES"] == "0,2"


def test_a_fraction_on_a_mig_device_gets_no_mps_limits_but_its_share_is_told():
    fraction = spec(gpu_indices=(11,), gpu_memory_mb=8000, gpu_compute_percent=50)

    on_mig = job_environment(fraction, {}, mps=MPS, mig_devices=MIG)
    whole = job_environment(spec(gpu_indices=(0,), gpu_memory_mb=8000), {}, mps=MPS)

    assert not [name for name in on_mig if name.startswith("CUDA_MPS_")]
    assert on_mig["FLEET_GPU_MEMORY_MB"] == "8000"
    assert whole["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8000M"  # MPS still applies there


def test_the_executor_starts_a_job_on_a_mig_device_with_its_uuid(tmp_path: Path, monkeypatch):
    """Through the real executor and job process, with the NVML backend reading a host whose
    second GPU is in MIG mode."""
    mig = FakeMigDevice(
        name="NVIDIA A100-SXM4-80GB MIG 3g.40gb", uuid="MIG-1111", total_mb=40192, used_mb=0
    )
    gpus = [
        FakeDevice(name="NVIDIA A100-SXM4-80GB", uuid="GPU-a0", total_mb=81920, used_mb=0),
        FakeDevice(
            name="NVIDIA A100-SXM4-80GB",
            uuid="GPU-a1",
            total_mb=81920,
            used_mb=0,
            mig_mode=1,
            mig_slots=[mig],
        ),
    ]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make_module(gpus))
    backend = NvmlBackend()
    (index,) = [g.index for g in backend.inventory() if g.uuid == "MIG-1111"]
    agent = Agent(tmp_path, gpu_backend=backend)
    out = tmp_path / "devices"

    agent.start(f'printf %s "$CUDA_VISIBLE_DEVICES" > {out}', gpu_indices=(index,))
    assert agent.wait_final()["state"] == "succeeded"

    assert out.read_text() == "MIG-1111"
