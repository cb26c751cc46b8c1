"""MIG devices read through NVML (docs/mig.md; the rules are in `workers.gpu.nvml`'s
docstring): finding the GPUs in MIG mode and their MIG devices, and reading each device's
inventory entry and sample. `MigReading` is a part of `NvmlBackend`, which holds the NVML
handles and the reading helpers it uses."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workers.gpu.models import normalize_model
from workers.gpu.nvml_common import BYTES_PER_MB, GpuLost, gpu_processes, nvml_text
from workers.gpu.types import GpuBackendError, GpuInfo, GpuSample

logger = logging.getLogger("workers.gpu.nvml")

# Indices kept for the MIG devices of each GPU (NVML allows at most 7 on A100 and H100).
MIG_SLOTS = 8

_MIG_NAME = re.compile(r"(?:^|\s)MIG\s+(\S+)")


def mig_profile(name: str, attributes: Any, memory_total_mb: int) -> str:
    """The MIG device's profile as NVIDIA names it ("3g.40gb", "1c.3g.40gb"): from its NVML
    name ("NVIDIA A100-SXM4-80GB MIG 3g.40gb"), else made from its slice counts and memory
    (NVIDIA's names round the memory up: a 3g.40gb device has 39.25 GiB)."""
    named = _MIG_NAME.search(name)
    if named:
        return named.group(1)
    gb = max(1, math.ceil(memory_total_mb / 1024))
    if attributes is None:
        return f"{gb}gb"
    gi, ci = int(attributes.gpuInstanceSliceCount), int(attributes.computeInstanceSliceCount)
    return f"{ci}c.{gi}g.{gb}gb" if 0 < ci < gi else f"{gi}g.{gb}gb"


@dataclass(frozen=True, slots=True)
class MigDevice:
    index: int  # fleet's index on this node
    parent: int  # NVML index of the GPU it is a slice of
    slot: int  # its index under the parent (nvmlDeviceGetMigDeviceHandleByIndex)
    handle: Any


class MigReading:
    """The MIG part of `NvmlBackend`."""

    if TYPE_CHECKING:  # what NvmlBackend provides
        _nvml: Any
        _handles: list[Any]
        _use_mig: bool
        _uuids: dict[int, str]
        _lost: dict[int, str]
        _mig_parents: set[int]
        _migs: list[MigDevice]
        _clock: Callable[[], float]

        def _code(self, exc: BaseException, name: str) -> bool: ...
        def _is_lost(self, exc: BaseException) -> bool: ...
        def _optional(self, index: int, what: str, call: Callable[..., Any], *args: Any) -> Any: ...
        def _required(self, index: int, what: str, call: Callable[..., Any], *args: Any) -> Any: ...
        def _board(self, index: int, handle: Any) -> dict[str, Any]: ...

    def _find_mig_devices(self) -> None:
        """Find the GPUs in MIG mode and, unless MIG is off, their MIG devices."""
        nvml = self._nvml
        if not hasattr(nvml, "nvmlDeviceGetMigMode"):
            return
        enabled = getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
        count = len(self._handles)
        for parent, handle in enumerate(self._handles):
            if parent in self._lost:
                continue
            try:
                current = nvml.nvmlDeviceGetMigMode(handle)[0]
            except nvml.NVMLError as exc:
                if self._is_lost(exc):
                    self._lost[parent] = str(exc)
                elif not self._code(exc, "NVML_ERROR_NOT_SUPPORTED"):
                    logger.warning("cannot read the MIG mode of GPU %d (%s); it is used whole",
                                   parent, exc)  # fmt: skip
                continue  # NOT_SUPPORTED: a GPU without MIG, used whole
            if current != enabled:
                continue
            self._mig_parents.add(parent)
            if not self._use_mig:
                logger.warning("GPU %d is in MIG mode and FLEET_MIG=off: it is not offered", parent)
                continue
            found = self._mig_slots(parent, handle, count)
            if found:
                logger.info("GPU %d is in MIG mode: offered as its MIG devices, indices %s",
                            parent, [m.index for m in self._migs if m.parent == parent])  # fmt: skip
            else:
                logger.warning("GPU %d is in MIG mode but has no MIG devices: it offers nothing "
                               "until GPU instances are created (docs/mig.md)", parent)  # fmt: skip

    def _mig_slots(self, parent: int, handle: Any, count: int) -> int:
        nvml = self._nvml
        try:
            slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
        except nvml.NVMLError as exc:
            logger.warning("cannot count the MIG devices of GPU %d: %s", parent, exc)
            return 0
        if slots > MIG_SLOTS:
            logger.warning("GPU %d may have %d MIG devices; fleet offers the first %d",
                           parent, slots, MIG_SLOTS)  # fmt: skip
        found = 0
        for slot in range(min(slots, MIG_SLOTS)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError as exc:
                if not self._code(exc, "NVML_ERROR_NOT_FOUND"):  # NOT_FOUND: an empty slot
                    logger.warning("cannot read MIG device %d of GPU %d: %s", slot, parent, exc)
                continue
            index = count + parent * MIG_SLOTS + slot
            try:
                self._uuids[index] = nvml_text(nvml.nvmlDeviceGetUUID(mig))
            except nvml.NVMLError as exc:
                logger.warning("cannot read the UUID of MIG device %d of GPU %d: %s",
                               slot, parent, exc)  # fmt: skip
                continue
            self._migs.append(MigDevice(index, parent, slot, mig))
            found += 1
        return found

    def _targets(self, parent: int) -> list[int]:
        """The indices a finding on GPU `parent` is reported on: the GPU itself, or each of
        its MIG devices when it is in MIG mode."""
        if parent in self._mig_parents:
            return [m.index for m in self._migs if m.parent == parent]
        return [parent]

    def _mig_info(self, mig: MigDevice) -> GpuInfo:
        nvml = self._nvml
        parent = self._handles[mig.parent]
        parent_name = nvml_text(
            self._required(mig.parent, "the name", nvml.nvmlDeviceGetName, parent)
        )
        # The whole board's memory, where NVML tells it (in MIG mode it may ask for privileges).
        board = self._optional(mig.parent, "memory", nvml.nvmlDeviceGetMemoryInfo, parent)
        name = nvml_text(self._required(mig.index, "the name", nvml.nvmlDeviceGetName, mig.handle))
        uuid = nvml_text(self._required(mig.index, "the UUID", nvml.nvmlDeviceGetUUID, mig.handle))
        memory = self._required(mig.index, "memory", nvml.nvmlDeviceGetMemoryInfo, mig.handle)
        total_mb = int(memory.total // BYTES_PER_MB)
        attributes = getattr(nvml, "nvmlDeviceGetAttributes", None)
        attrs = None
        if attributes is not None:
            try:
                attrs = self._optional(mig.index, "MIG slices", attributes, mig.handle)
            except GpuLost:
                raise
            except GpuBackendError as exc:
                logger.warning("%s", exc)
        profile = mig_profile(name, attrs, total_mb)
        board_mb = int(board.total // BYTES_PER_MB) if board is not None else None
        model = f"{normalize_model(parent_name, board_mb)} MIG {profile}"
        return GpuInfo(
            mig.index,
            uuid,
            name,
            model,
            total_mb,
            mig_parent=mig.parent,
            mig_profile=profile,
            compute_slices=int(attrs.computeInstanceSliceCount) if attrs is not None else None,
        )

    def _sample_mig(self, mig: MigDevice) -> GpuSample:
        """One reading of a MIG device: its own memory and processes; utilisation where NVML
        gives it per instance (it does not today: None, unknown); the board's temperature,
        clocks, fan and throttle reasons, which the slice shares; no power or ECC count,
        which belong to the whole board."""
        nvml = self._nvml
        opt = self._optional
        handle = mig.handle
        uuid = nvml_text(self._required(mig.index, "the UUID", nvml.nvmlDeviceGetUUID, handle))
        memory = self._required(mig.index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        rates = opt(mig.index, "utilisation", nvml.nvmlDeviceGetUtilizationRates, handle)
        procs = opt(mig.index, "processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        return GpuSample(
            index=mig.index,
            uuid=uuid,
            util_percent=float(rates.gpu) if rates is not None else None,
            memory_util_percent=float(rates.memory) if rates is not None else None,
            memory_used_mb=int(memory.used // BYTES_PER_MB),
            memory_total_mb=int(memory.total // BYTES_PER_MB),
            power_w=None,
            power_limit_w=None,
            ecc_errors=None,
            xid_errors=None,
            processes=gpu_processes(procs or []),
            sampled_at=self._clock(),
            **self._board(mig.parent, self._handles[mig.parent]),
        )
