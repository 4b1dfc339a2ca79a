"""A faithful stand-in for the pynvml module, for the NVML backend's tests (no GPU here).

Everything but the NVML calls is the real pynvml: its constants, its ``NVMLError`` (whose
constructor returns the per-code subclass, with ``.value``), and its ctypes structures
(``c_nvmlMemory_t``, ``c_nvmlUtilization_t``, ``c_nvmlProcessUtilizationSample_t``).
Handles are fresh objects on every call, as pynvml's ``c_nvmlDevice_t`` pointers are: two
handles of one device are not the same object, and a dead handle's ``id`` is soon another's.
Compute processes are pynvml's "friendly objects" with ``pid``, ``usedGpuMemory`` (None
when NVML cannot tell), ``gpuInstanceId`` and ``computeInstanceId``. The functions keep
pynvml's names and signatures and raise the codes the real driver raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml as _real

NVMLError = _real.NVMLError
NVML_SUCCESS = _real.NVML_SUCCESS
NVML_ERROR_UNINITIALIZED = _real.NVML_ERROR_UNINITIALIZED
NVML_ERROR_NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_NOT_FOUND = _real.NVML_ERROR_NOT_FOUND
NVML_ERROR_DRIVER_NOT_LOADED = _real.NVML_ERROR_DRIVER_NOT_LOADED
NVML_ERROR_LIBRARY_NOT_FOUND = _real.NVML_ERROR_LIBRARY_NOT_FOUND
NVML_ERROR_GPU_IS_LOST = _real.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_INVALID_ARGUMENT = _real.NVML_ERROR_INVALID_ARGUMENT
NVML_DEVICE_MIG_ENABLE = _real.NVML_DEVICE_MIG_ENABLE
NVML_DEVICE_MIG_DISABLE = _real.NVML_DEVICE_MIG_DISABLE


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * 2**30
    used: int = 0
    gpu_util: int = 0  # percent
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    samples: list[tuple[int, int, int, int]] = field(default_factory=list)  # pid, ts, sm, mem
    mig_mode: int | None = None  # None: NOT_SUPPORTED
    mig_slots: list[FakeDevice | None] = field(default_factory=list)
    gpu_instance_id: int | None = None  # of a MIG device; None: NOT_SUPPORTED
    process_utilization_supported: bool = True
    lost: bool = False


class FakeHandle:
    """A device handle: like a ctypes pointer, compared by identity and made anew each call."""

    __slots__ = ("device",)

    def __init__(self, device: FakeDevice) -> None:
        self.device = device


class FakeNvml:
    """Module-like object: pass it as ``NvmlBackend(nvml=FakeNvml(...))``."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE

    def __init__(self, devices: list[FakeDevice], init_error: int | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.initialised = 0
        self.calls: list[tuple[str, Any]] = []

    def _check(self) -> None:
        if self.initialised < 1:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _dev(self, handle: Any) -> FakeDevice:
        self._check()
        if not isinstance(handle, FakeHandle):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if handle.device.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return handle.device

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check()
        if not 0 <= index < len(self.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(self.devices[index])

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._dev(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._dev(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        dev = self._dev(handle)
        return _real.c_nvmlMemory_t(total=dev.total, free=dev.total - dev.used, used=dev.used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        dev = self._dev(handle)
        if dev.mig_mode == NVML_DEVICE_MIG_ENABLE or any(
            dev is child for child in _mig_children(self.devices)
        ):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _real.c_nvmlUtilization_t(gpu=dev.gpu_util, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        dev = self._dev(handle)
        out = []
        for pid, used in dev.processes:
            obj = _real.nvmlFriendlyObject(
                {"pid": pid, "usedGpuMemory": used, "gpuInstanceId": 0xFFFFFFFF,
                 "computeInstanceId": 0xFFFFFFFF}
            )  # fmt: skip
            out.append(obj)
        return out

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        dev = self._dev(handle)
        self.calls.append(("nvmlDeviceGetProcessUtilization", timeStamp))
        if not dev.process_utilization_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        fresh = [s for s in dev.samples if s[1] > timeStamp]
        if not fresh:
            raise NVMLError(NVML_ERROR_NOT_FOUND)  # what the driver says for "no samples"
        return [
            _real.c_nvmlProcessUtilizationSample_t(
                pid=pid, timeStamp=ts, smUtil=sm, memUtil=mem, encUtil=0, decUtil=0
            )
            for pid, ts, sm, mem in fresh
        ]

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        dev = self._dev(handle)
        if dev.mig_mode is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [dev.mig_mode, dev.mig_mode]

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        dev = self._dev(handle)
        if dev.gpu_instance_id is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return dev.gpu_instance_id

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return len(self._dev(handle).mig_slots)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> FakeHandle:
        slots = self._dev(handle).mig_slots
        if not 0 <= index < len(slots):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        child = slots[index]
        if child is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return FakeHandle(child)


def _mig_children(devices: list[FakeDevice]) -> list[FakeDevice]:
    return [c for d in devices for c in d.mig_slots if c is not None]
