import json
import sys

import pytest

from tests.workers.gpu import fake_pynvml
from tests.workers.gpu.fake_pynvml import FakeDevice
from workers.gpu import GpuBackendError, NvmlBackend, select_backend


def _devices():
    return [
        FakeDevice(
            name=b"NVIDIA A100-SXM4-80GB",  # older bindings return bytes
            uuid="GPU-aaaa",
            total_mb=81920,
            used_mb=12000,
            util=93,
            mem_util=41,
            temp=67,
            power_mw=312_500,
            limit_mw=400_000,
            throttle=0x004 | 0x020,
            ecc=0,
            procs=[(4242, 11000), (4243, None)],
        ),
        FakeDevice(name="Tesla T4", uuid="GPU-bbbb", total_mb=15360, used_mb=0, fan=None),
    ]


@pytest.fixture
def nvml(monkeypatch):
    mod = fake_pynvml.make_module(_devices())
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def test_inventory_reports_index_uuid_name_model_and_memory(nvml):
    gpus = NvmlBackend().inventory()

    assert [(g.index, g.uuid, g.name, g.model, g.memory_total_mb) for g in gpus] == [
        (0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", "A100-80GB", 81920),
        (1, "GPU-bbbb", "Tesla T4", "T4-16GB", 15360),
    ]


def test_sample_converts_units_and_lists_processes(nvml):
    a100 = NvmlBackend(clock=lambda: 1234.5).sample()[0]

    assert a100.util_percent == 93 and a100.memory_util_percent == 41
    assert (a100.memory_used_mb, a100.memory_total_mb) == (12000, 81920)
    assert (a100.power_w, a100.power_limit_w) == (312.5, 400.0)
    assert (a100.sm_clock_mhz, a100.mem_clock_mhz, a100.temperature_c) == (1410, 1593, 67)
    assert a100.throttle_reasons == ("sw_power_cap", "sw_thermal_slowdown")
    assert a100.ecc_errors == 0
    assert [tuple(p) for p in a100.processes] == [(4242, 11000), (4243, None)]
    assert a100.sampled_at == 1234.5


def test_unsupported_fields_read_as_none(nvml):
    t4 = NvmlBackend().sample()[1]

    assert t4.fan_percent is None
    assert t4.ecc_errors is None
    assert t4.xid_errors is None
    assert t4.util_percent == 0  # supported fields are still read


def test_sample_to_dict_is_json_and_tags_processes_with_jobs(nvml):
    sample = NvmlBackend().sample()[0]

    data = json.loads(json.dumps(sample.to_dict({4242: 17})))

    assert data["processes"] == [
        {"pid": 4242, "used_memory_mb": 11000, "job_id": 17},
        {"pid": 4243, "used_memory_mb": None, "job_id": None},
    ]
    assert data["throttle_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]


def test_init_failure_raises_with_nvml_message(monkeypatch):
    failing = fake_pynvml.make_module([], init_error=fake_pynvml.NVMLError_DriverNotLoaded())
    monkeypatch.setitem(sys.modules, "pynvml", failing)

    with pytest.raises(GpuBackendError, match="Driver Not Loaded"):
        NvmlBackend()


def test_select_backend_does_not_fall_back_to_simulation(monkeypatch):
    failing = fake_pynvml.make_module([], init_error=fake_pynvml.NVMLError_DriverNotLoaded())
    monkeypatch.setitem(sys.modules, "pynvml", failing)

    with pytest.raises(GpuBackendError, match="Driver Not Loaded"):
        select_backend(None, "gpu-01", environ={})


def test_missing_pynvml_raises_backend_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes the import fail

    with pytest.raises(GpuBackendError, match="pynvml"):
        NvmlBackend()


def test_other_nvml_errors_name_the_gpu_and_field(nvml):
    def lost(handle):
        raise fake_pynvml.NVMLError("GPU is lost")

    nvml.nvmlDeviceGetPowerUsage = lost

    with pytest.raises(GpuBackendError, match="power draw of GPU 0: GPU is lost"):
        NvmlBackend().sample()


def test_close_shuts_nvml_down_once(nvml):
    backend = NvmlBackend()
    backend.close()
    backend.close()

    assert nvml.calls == ["init", "shutdown"]
