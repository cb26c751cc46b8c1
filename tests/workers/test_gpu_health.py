"""GPU health on the agent: the NVML backend's Xid events, uncorrectable ECC counts and
lost GPUs; the simulated backend's faults; and a simulated fault end to end, through a real
agent process and the control side, to its node drained and resumed.

There is no GPU on the machines these tests run on, so NVML cannot really answer: the
NVML tests use the real `pynvml` module (its constants, its error classes) with only the
functions that would call into libnvidia-ml replaced, each answering as NVML does.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pynvml
import pytest

from fleet.models import Node
from fleet.services.nodes import node_resume
from tests.workers.agent_harness import ControlPump
from tests.workers.conftest import StartAgent
from workers.gpu import GpuFinding, NvmlBackend, SimulatedGpuBackend, select_backend
from workers.gpu.simulated import parse_faults
from workers.runtime import HEALTH_TASK

MB = 1024 * 1024


class Device:
    def __init__(self, uuid: str, ecc: int | None = 0) -> None:
        self.uuid = uuid
        self.ecc = ecc
        self.lost = False
        self.xid_supported = True


def _lost() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Three devices behind pynvml's own functions; `events` is the driver's event queue."""
    devices = [Device("GPU-aa00"), Device("GPU-aa01", ecc=None), Device("GPU-aa02")]
    events: list[Any] = []
    state = types.SimpleNamespace(devices=devices, events=events, registered=[], freed=[])

    def device_call(fn: Any) -> Any:
        def call(handle: Device, *args: Any) -> Any:
            if handle.lost:
                raise _lost()
            return fn(handle, *args)

        return call

    def register(handle: Device, types_mask: int, event_set: Any) -> None:
        if handle.lost:
            raise _lost()
        if not handle.xid_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        state.registered.append((handle.uuid, types_mask, event_set))

    def wait(event_set: Any, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # never blocks the telemetry tick
        if not events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return events.pop(0)

    def ecc(handle: Device, error_type: int, counter_type: int) -> int:
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        if handle.ecc is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle.ecc

    def unsupported(*_: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    calls = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: len(devices),
        "nvmlDeviceGetHandleByIndex": lambda i: devices[i],
        "nvmlDeviceGetUUID": device_call(lambda h: h.uuid),
        "nvmlDeviceGetName": device_call(lambda h: "NVIDIA A100-SXM4-80GB"),
        "nvmlDeviceGetMemoryInfo": device_call(
            lambda h: types.SimpleNamespace(total=81920 * MB, used=1000 * MB)
        ),
        "nvmlDeviceGetTotalEccErrors": device_call(ecc),
        "nvmlEventSetCreate": lambda: "event-set",
        "nvmlDeviceRegisterEvents": register,
        "nvmlEventSetWait_v2": wait,
        "nvmlEventSetFree": lambda s: state.freed.append(s),
    }
    for name in (
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetClockInfo", "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses",
    ):  # fmt: skip
        calls[name] = device_call(unsupported)
    for name, fn in calls.items():
        assert hasattr(pynvml, name), name  # only functions the real library has
        monkeypatch.setattr(pynvml, name, fn)
    return state


def xid_event(device: Device, code: int) -> Any:
    return types.SimpleNamespace(
        device=device, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=code
    )


def test_nvml_registers_every_gpu_for_xid_events_and_frees_the_set(gpus: Any) -> None:
    gpus.devices[1].xid_supported = False
    backend = NvmlBackend()
    assert [(u, m) for u, m, _ in gpus.registered] == [
        ("GPU-aa00", pynvml.nvmlEventTypeXidCriticalError),
        ("GPU-aa02", pynvml.nvmlEventTypeXidCriticalError),
    ]
    assert backend.health() == []  # no event, no ECC error: nothing to report
    backend.close()
    assert gpus.freed == ["event-set"]


def test_nvml_xid_events_become_findings_kept_every_tick(gpus: Any) -> None:
    backend = NvmlBackend(clock=lambda: 1000.0)
    gpus.events += [xid_event(gpus.devices[2], 79), xid_event(gpus.devices[0], 48)]

    first = backend.health()

    assert [(f.index, f.uuid, f.kind, f.code, f.detail) for f in first] == [
        (2, "GPU-aa02", "xid", 79, "XID 79"),
        (0, "GPU-aa00", "xid", 48, "XID 48"),
    ]
    assert not gpus.events  # drained without waiting
    assert backend.health() == first  # sent again next tick, with the same keys
    gpus.events.append(xid_event(gpus.devices[2], 79))  # the same Xid again is a new event
    keys = [f.key for f in backend.health()]
    assert len(keys) == 3 and len(set(keys)) == 3


def test_nvml_uncorrectable_ecc_errors_are_a_finding_while_counted(gpus: Any) -> None:
    backend = NvmlBackend()
    gpus.devices[0].ecc = 2
    [finding] = backend.health()
    assert (finding.index, finding.kind, finding.code) == (0, "ecc", 2)
    assert finding.detail == "2 uncorrectable ECC errors"
    assert backend.health()[0].key == finding.key  # the same count, the same finding
    gpus.devices[0].ecc = 3
    assert backend.health()[0].key != finding.key


def test_nvml_a_lost_gpu_leaves_the_samples_and_is_reported_lost(gpus: Any) -> None:
    backend = NvmlBackend()
    assert [s.index for s in backend.sample()] == [0, 1, 2]
    backend.inventory()  # the agent registers
    gpus.devices[1].lost = True

    samples = backend.sample()  # the tick goes on for the other GPUs

    assert [s.index for s in samples] == [0, 2]
    # It stays registered as it was, so the node keeps the GPU, its history and its name.
    assert [(g.index, g.uuid) for g in backend.inventory()] == [
        (0, "GPU-aa00"), (1, "GPU-aa01"), (2, "GPU-aa02")
    ]  # fmt: skip
    [finding] = backend.health()
    assert (finding.index, finding.uuid, finding.kind, finding.code) == (
        1,
        "GPU-aa01",
        "lost",
        None,
    )
    assert "GPU is lost" in finding.detail
    assert backend.health() == [finding]


def test_nvml_a_gpu_lost_before_the_agent_started_is_reported(gpus: Any) -> None:
    gpus.devices[2].lost = True
    backend = NvmlBackend()
    assert [g.index for g in backend.inventory()] == [0, 1]  # the others still register
    assert [(f.index, f.uuid, f.kind) for f in backend.health()] == [(2, "", "lost")]


def test_simulated_faults_from_the_environment_and_a_file(tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    backend = select_backend(
        "4xA100-80GB",
        node_name="n1",
        environ={"FLEET_SIM_GPU_FAULTS": "1:xid79", "FLEET_SIM_GPU_FAULTS_FILE": str(faults)},
    )
    assert [f.to_dict() for f in backend.health()] == [  # type: ignore[attr-defined]
        {"index": 1, "uuid": "SIM-n1-1", "kind": "xid", "code": 79, "detail": "XID 79",
         "key": "sim:SIM-n1-1:xid:79"}
    ]  # fmt: skip
    faults.write_text("0:ecc2\n3:lost\n")
    found = backend.health()  # type: ignore[attr-defined]
    assert [(f.index, f.kind, f.code) for f in found] == [
        (1, "xid", 79), (0, "ecc", 2), (3, "lost", None)
    ]  # fmt: skip
    assert [s.index for s in backend.sample()] == [0, 1, 2]  # the lost GPU reads nothing


@pytest.mark.parametrize("spec", ["1:xid", "1:lost5", "9:xid79", "a:ecc1", "1:fire2"])
def test_a_simulated_fault_that_cannot_be_read_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="simulated GPU fault"):
        parse_faults(spec, 4)
    with pytest.raises(ValueError):
        SimulatedGpuBackend("4xA100", node_name="n", faults=spec)


def test_findings_are_json(gpus: Any) -> None:
    finding = GpuFinding(0, "GPU-aa00", "xid", 79, "XID 79", "b:GPU-aa00:xid:79:1.0:0")
    assert finding.to_dict()["code"] == 79


def test_a_simulated_xid_drains_the_node_through_a_real_agent_and_resume_sticks(
    agents: StartAgent, control: ControlPump, tmp_path: Path, staff: Any
) -> None:
    faults = tmp_path / "gpu-faults"
    node, agent = agents("2xA100-80GB", env={"FLEET_SIM_GPU_FAULTS_FILE": str(faults)})
    assert Node.objects.get(pk=node.pk).state == "up"

    faults.write_text("1:xid79\n")
    control.pump(
        lambda: Node.objects.get(pk=node.pk).drain_requested, what="the node to be drained"
    )
    drained = Node.objects.get(pk=node.pk)
    assert drained.state == "draining"
    assert drained.state_reason == (
        f"GPU 1 (SIM-{node.name}-1) reported XID 79 (fell off the bus); "
        "drained until staff resume it"
    )
    signed = control.opened(HEALTH_TASK)
    assert signed and signed[0][0] == node.name  # signed by the node, as every message

    control.run(lambda: node_resume(node=drained, user=staff))
    sent = len(control.opened(HEALTH_TASK))
    control.pump(lambda: len(control.opened(HEALTH_TASK)) >= sent + 3, what="3 more findings")
    resumed = Node.objects.get(pk=node.pk)
    assert (resumed.state, resumed.state_reason, resumed.drain_requested) == ("up", "", False)

    faults.write_text("1:xid79\n0:lost\n")
    control.pump(
        lambda: Node.objects.get(pk=node.pk).drain_requested, what="the node drained again"
    )
    assert Node.objects.get(pk=node.pk).state_reason.startswith(f"GPU 0 (SIM-{node.name}-0)")
    agent.kill()
