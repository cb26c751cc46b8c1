"""MIG devices offered as GPUs by the NVML backend, against a pynvml stand-in shaped like
the real module (tests/workers/gpu/fake_pynvml.py; NVML cannot run on these machines)."""

import json
import sys

import pynvml as real_pynvml
import pytest

from tests.workers.gpu import fake_pynvml
from tests.workers.gpu.fake_pynvml import FakeDevice, FakeMigDevice
from workers.gpu import NvmlBackend, normalize_model, select_backend
from workers.gpu.nvml_mig import MIG_SLOTS, mig_profile


def _slice(uuid, used_mb=0, procs=()):
    return FakeMigDevice(
        name="NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        uuid=uuid,
        total_mb=40192,
        used_mb=used_mb,
        gi_slices=3,
        ci_slices=3,
        procs=list(procs),
    )


def _host(slots=None):
    """GPU 0: an A100 used whole; GPU 1: an A100 in MIG mode with two 3g.40gb devices;
    GPU 2: a V100, which has no MIG (its MIG mode query answers NOT_SUPPORTED)."""
    if slots is None:
        slots = [_slice("MIG-1111", used_mb=9000, procs=[(5151, 8800)]), _slice("MIG-2222")]
    return [
        FakeDevice(name="NVIDIA A100-SXM4-80GB", uuid="GPU-a0", total_mb=81920, used_mb=10),
        FakeDevice(
            name="NVIDIA A100-SXM4-80GB",
            uuid="GPU-a1",
            total_mb=81920,
            used_mb=9000,
            temp=55,
            sm_clock=1305,
            ecc=0,
            mig_mode=1,
            mig_slots=slots,
        ),
        FakeDevice(
            name="Tesla V100-SXM2-32GB", uuid="GPU-v2", total_mb=32768, used_mb=0, mig_mode=None
        ),
    ]


def _use(monkeypatch, devices):
    mod = fake_pynvml.make_module(devices)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


# MIG device `slot` of GPU 1 on this three-GPU host.
def _mig_index(slot):
    return 3 + 1 * MIG_SLOTS + slot


def test_the_stand_in_has_only_functions_and_errors_the_real_pynvml_has():
    mod = fake_pynvml.make_module([], events=True)
    names = [n for n in vars(mod) if n.startswith(("nvml", "NVML"))]

    assert "nvmlDeviceGetMigDeviceHandleByIndex" in names
    assert [n for n in names if not hasattr(real_pynvml, n)] == []
    for name in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NOT_FOUND", "NVML_DEVICE_MIG_ENABLE",
                 "NVML_ERROR_TIMEOUT", "nvmlEventTypeXidCriticalError"):  # fmt: skip
        assert getattr(mod, name) == getattr(real_pynvml, name)


def test_a_gpu_in_mig_mode_is_offered_as_its_mig_devices_and_never_whole(monkeypatch):
    _use(monkeypatch, _host())

    gpus = NvmlBackend().inventory()

    assert [(g.index, g.uuid, g.model, g.memory_total_mb, g.mig_parent) for g in gpus] == [
        (0, "GPU-a0", "A100-80GB", 81920, None),
        (2, "GPU-v2", "V100-32GB", 32768, None),
        (_mig_index(0), "MIG-1111", "A100-80GB MIG 3g.40gb", 40192, 1),
        (_mig_index(1), "MIG-2222", "A100-80GB MIG 3g.40gb", 40192, 1),
    ]
    mig = gpus[2]
    assert (mig.name, mig.mig_profile, mig.compute_slices) == (
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        "3g.40gb",
        3,
    )
    assert "GPU-a1" not in [g.uuid for g in gpus]
    assert len({g.index for g in gpus}) == len(gpus)  # unique on the node


def test_a_gpu_whose_mig_mode_query_is_not_supported_is_used_whole(monkeypatch):
    _use(monkeypatch, [_host()[2]])

    backend = NvmlBackend()

    assert [(g.index, g.model) for g in backend.inventory()] == [(0, "V100-32GB")]
    assert [s.util_percent for s in backend.sample()] == [0]
    assert backend.mig_devices == {}


def test_mig_devices_map_their_indices_to_the_uuids_cuda_takes(monkeypatch):
    _use(monkeypatch, _host())

    assert NvmlBackend().mig_devices == {_mig_index(0): "MIG-1111", _mig_index(1): "MIG-2222"}


def test_an_empty_slot_is_skipped_and_the_others_keep_their_slot_index(monkeypatch):
    _use(monkeypatch, _host(slots=[None, _slice("MIG-3333")]))

    gpus = NvmlBackend().inventory()

    assert [(g.index, g.uuid) for g in gpus if g.mig_parent is not None] == [
        (_mig_index(1), "MIG-3333")
    ]


def test_a_mig_device_reading_has_its_own_memory_and_unknown_utilisation(monkeypatch):
    _use(monkeypatch, _host())

    samples = {s.index: s for s in NvmlBackend(clock=lambda: 99.0).sample()}

    assert sorted(samples) == [0, 2, _mig_index(0), _mig_index(1)]
    mig = samples[_mig_index(0)]
    assert (mig.uuid, mig.memory_used_mb, mig.memory_total_mb) == ("MIG-1111", 9000, 40192)
    # NVML answers NOT_SUPPORTED for utilisation per MIG instance: unknown, never 0 %.
    assert mig.util_percent is None and mig.memory_util_percent is None
    assert [tuple(p) for p in mig.processes] == [(5151, 8800)]
    # The board's temperature and clocks are the slice's too; its power is the whole board's.
    assert (mig.temperature_c, mig.sm_clock_mhz) == (55, 1305)
    assert mig.power_w is None and mig.power_limit_w is None and mig.ecc_errors is None
    data = json.loads(json.dumps(mig.to_dict({5151: 42})))
    assert data["util_percent"] is None
    assert data["processes"] == [{"pid": 5151, "used_memory_mb": 8800, "job_id": 42}]
    assert samples[0].util_percent == 0  # a whole GPU still reports its utilisation


def test_findings_of_a_gpu_in_mig_mode_are_reported_on_each_of_its_mig_devices(monkeypatch):
    devices = _host()
    _use(monkeypatch, devices)
    backend = NvmlBackend()
    devices[1].ecc = 2

    findings = [(f.index, f.uuid, f.kind, f.code) for f in backend.health()]

    assert findings == [
        (_mig_index(0), "MIG-1111", "ecc", 2),
        (_mig_index(1), "MIG-2222", "ecc", 2),
    ]


def test_an_xid_of_a_gpu_in_mig_mode_is_a_finding_on_each_of_its_mig_devices(monkeypatch):
    devices = _host()
    mod = fake_pynvml.make_module(devices, events=True)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    backend = NvmlBackend(clock=lambda: 5.0)
    mod.events += [fake_pynvml.xid_event(devices[1], 79), fake_pynvml.xid_event(devices[0], 13)]

    findings = [(f.index, f.uuid, f.kind, f.code) for f in backend.health()]

    assert findings == [
        (_mig_index(0), "MIG-1111", "xid", 79),
        (_mig_index(1), "MIG-2222", "xid", 79),
        (0, "GPU-a0", "xid", 13),
    ]


def test_a_lost_board_takes_its_mig_devices_out_of_the_samples(monkeypatch):
    mod = _use(monkeypatch, _host())
    backend = NvmlBackend()
    backend.inventory()
    mod.NVML_ERROR_GPU_IS_LOST = 15
    real = mod.nvmlDeviceGetTemperature

    class Lost(fake_pynvml.NVMLError):
        value = 15

    def temperature(dev, sensor):
        if dev is backend._handles[1]:
            raise Lost("GPU is lost")
        return real(dev, sensor)

    mod.nvmlDeviceGetTemperature = temperature

    assert sorted(s.index for s in backend.sample()) == [0, 2]
    lost = [(f.index, f.uuid) for f in backend.health() if f.kind == "lost"]
    assert lost == [(_mig_index(0), "MIG-1111"), (_mig_index(1), "MIG-2222")]
    # They stay registered (with their history); the findings say they are lost.
    assert [g.uuid for g in backend.inventory()][-2:] == ["MIG-1111", "MIG-2222"]


def test_the_model_comes_from_the_name_where_the_board_hides_its_memory(monkeypatch):
    mod = _use(monkeypatch, _host())
    real = mod.nvmlDeviceGetMemoryInfo

    def memory(dev):
        if isinstance(dev, FakeDevice) and dev.mig_mode == 1:
            raise fake_pynvml.NVMLError_NotSupported()
        return real(dev)

    mod.nvmlDeviceGetMemoryInfo = memory

    models = [g.model for g in NvmlBackend().inventory() if g.mig_parent is not None]

    assert models == ["A100-80GB MIG 3g.40gb"] * 2


def test_fleet_mig_off_offers_no_gpu_in_mig_mode(monkeypatch):
    _use(monkeypatch, _host())

    backend = select_backend(None, "gpu-01", environ={"FLEET_MIG": "off"})

    assert [g.uuid for g in backend.inventory()] == ["GPU-a0", "GPU-v2"]
    assert [s.uuid for s in backend.sample()] == ["GPU-a0", "GPU-v2"]
    assert backend.mig_devices == {}  # type: ignore[attr-defined]


def test_fleet_mig_takes_on_or_off_only(monkeypatch):
    _use(monkeypatch, _host())

    on = select_backend(None, "gpu-01", environ={"FLEET_MIG": "on"})
    assert len(on.mig_devices) == 2  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="FLEET_MIG='sometimes' must be 'on'"):
        select_backend(None, "gpu-01", environ={"FLEET_MIG": "sometimes"})


def test_mig_profile_from_the_name_else_from_slices_and_memory():
    class Attrs:
        gpuInstanceSliceCount = 3
        computeInstanceSliceCount = 1

    assert mig_profile("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb", None, 40192) == "1c.3g.40gb"
    assert mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None, 4864) == "1g.5gb"
    assert mig_profile("MIG 2g.20gb", None, 19968) == "2g.20gb"
    assert mig_profile("A MIG-less name", Attrs(), 20096) == "1c.3g.20gb"
    assert mig_profile("A MIG-less name", None, 40192) == "40gb"


def test_normalize_model_without_memory_reads_the_size_in_the_name():
    assert normalize_model("NVIDIA H100 80GB HBM3", None) == "H100-80GB"
    assert normalize_model("NVIDIA A100-SXM4-40GB", None) == "A100-40GB"
    assert normalize_model("NVIDIA H200", None) == "H200-141GB"
