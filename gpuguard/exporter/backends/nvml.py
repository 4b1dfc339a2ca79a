"""NVML backend (pynvml, package nvidia-ml-py): devices, MIG devices, compute processes.

NVML semantics it respects:
- NVML is initialised once, in the constructor; ``close()`` shuts it down.
- Device utilization is the share of time any kernel ran; per-process SM use comes from
  ``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)``, which we call with the
  newest timestamp seen on that device, so each sample is counted once. Its
  ``NVML_ERROR_NOT_FOUND`` means "no samples since then", not a failure.
- ``usedGpuMemory`` may be ``None`` (pynvml maps NVML_VALUE_NOT_AVAILABLE to None).
- Handles are fresh ctypes pointers on every call (and a dead one's ``id`` is soon reused),
  so what is cached per device is keyed by its index (``"0"``, ``"0:1"`` on MIG), never by
  the handle.
- With MIG on, processes are listed per MIG device (not on the parent, which would count
  them twice); MIG devices have no utilization counters, so theirs are ``None``.
Every ``NVMLError`` becomes a ``BackendError`` in ``_translate`` and nowhere else.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpuguard.exporter.errors import BackendError, BackendUnavailable
from gpuguard.exporter.model import DeviceSample, GpuProcess, GpuSample, ProcessUtilization

T = TypeVar("T")

# Codes that mean "this machine has no usable NVML" rather than "this call failed".
_UNAVAILABLE_CODES = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")


def _text(value: Any) -> str:
    """Old pynvml versions return bytes for names and UUIDs."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """GPU samples from NVML; ``nvml`` is the pynvml module (a fake one in tests)."""

    name = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise BackendUnavailable(f"pynvml not importable: {exc}") from exc
        self._nvml = nvml
        self._last_seen_us: dict[str, int] = {}  # device key -> newest sample timestamp
        self._static: dict[str, tuple[str, str]] = {}  # device key -> (uuid, name)
        try:
            self._call(nvml.nvmlInit)
        except BackendError as exc:
            raise BackendUnavailable(str(exc)) from exc

    def _is(self, exc: Exception, code_name: str) -> bool:
        return getattr(exc, "value", None) == getattr(self._nvml, code_name, object())

    def _translate(self, exc: Exception, what: str) -> BackendError:
        """The one place an ``NVMLError`` becomes a ``BackendError``."""
        message = f"NVML {what}: {exc} (code {getattr(exc, 'value', None)})"
        if any(self._is(exc, name) for name in _UNAVAILABLE_CODES):
            return BackendUnavailable(message)
        return BackendError(message)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Call one NVML function; its ``NVMLError`` becomes a ``BackendError``."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise self._translate(exc, fn.__name__) from exc

    def _optional(self, fn: Callable[..., T], *args: Any) -> T | None:
        """Like ``_call`` but NOT_SUPPORTED / NOT_FOUND give ``None`` (feature absent)."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            if self._is(exc, "NVML_ERROR_NOT_SUPPORTED") or self._is(exc, "NVML_ERROR_NOT_FOUND"):
                return None
            raise self._translate(exc, fn.__name__) from exc

    def sample(self) -> GpuSample:
        nv = self._nvml
        before = time.time()
        devices: list[DeviceSample] = []
        for index in range(self._call(nv.nvmlDeviceGetCount)):
            handle = self._call(nv.nvmlDeviceGetHandleByIndex, index)
            mig = self._optional(nv.nvmlDeviceGetMigMode, handle)
            if mig is not None and mig[0] == nv.NVML_DEVICE_MIG_ENABLE:
                devices.append(self._device(index, None, handle, with_processes=False))
                devices.extend(self._mig_devices(index, handle))
            else:
                devices.append(self._device(index, None, handle, with_processes=True))
        # the middle of the calls is the best single time for what they reported
        return GpuSample(timestamp=(before + time.time()) / 2, devices=tuple(devices))

    def _mig_devices(self, index: int, handle: Any) -> list[DeviceSample]:
        nv = self._nvml
        found = []
        for mig_index in range(self._call(nv.nvmlDeviceGetMaxMigDeviceCount, handle)):
            mig_handle = self._optional(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, mig_index)
            if mig_handle is not None:  # NOT_FOUND: an empty MIG slot
                found.append(self._device(index, mig_index, mig_handle, with_processes=True))
        return found

    def _device(
        self, index: int, mig_index: int | None, handle: Any, with_processes: bool
    ) -> DeviceSample:
        nv = self._nvml
        key = str(index) if mig_index is None else f"{index}:{mig_index}"
        uuid, name = self._identity(key, handle)
        memory = self._call(nv.nvmlDeviceGetMemoryInfo, handle)
        rates = self._optional(nv.nvmlDeviceGetUtilizationRates, handle)
        processes: tuple[GpuProcess, ...] = ()
        samples: tuple[ProcessUtilization, ...] = ()
        if with_processes:
            processes = tuple(
                GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in self._call(nv.nvmlDeviceGetComputeRunningProcesses, handle)
            )
            samples = self._process_samples(key, handle)
        return DeviceSample(
            index=index,
            uuid=uuid,
            name=name,
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            utilization_ratio=None if rates is None else rates.gpu / 100.0,
            processes=processes,
            process_samples=samples,
            mig_index=mig_index,
            gpu_instance_id=None if mig_index is None else self._gpu_instance_id(handle),
        )

    def _gpu_instance_id(self, mig_handle: Any) -> int | None:
        # The GPU instance id dcgm-exporter labels GPU_I_ID; older bindings lack the call.
        get = getattr(self._nvml, "nvmlDeviceGetGpuInstanceId", None)
        if get is None:
            return None
        value = self._optional(get, mig_handle)
        return None if value is None else int(value)

    def _identity(self, key: str, handle: Any) -> tuple[str, str]:
        if key not in self._static:  # a device's UUID and name never change: ask once
            nv = self._nvml
            uuid = _text(self._call(nv.nvmlDeviceGetUUID, handle))
            self._static[key] = (uuid, _text(self._call(nv.nvmlDeviceGetName, handle)))
        return self._static[key]

    def _process_samples(self, key: str, handle: Any) -> tuple[ProcessUtilization, ...]:
        nv = self._nvml
        last_seen = self._last_seen_us.get(key, 0)
        try:
            raw = nv.nvmlDeviceGetProcessUtilization(handle, last_seen)
        except nv.NVMLError as exc:
            # NOT_FOUND: no samples since last_seen. SUCCESS (0) is what pynvml raises when
            # the driver answers "zero samples" on the size query. NOT_SUPPORTED: MIG, old GPUs.
            if getattr(exc, "value", None) in (
                0,
                nv.NVML_ERROR_NOT_FOUND,
                nv.NVML_ERROR_NOT_SUPPORTED,
            ):
                return ()
            raise self._translate(exc, "nvmlDeviceGetProcessUtilization") from exc
        samples = tuple(
            ProcessUtilization(
                pid=int(s.pid),
                timestamp_us=int(s.timeStamp),
                sm_ratio=min(int(s.smUtil), 100) / 100.0,
                mem_ratio=min(int(s.memUtil), 100) / 100.0,
            )
            for s in raw
            if int(s.timeStamp) > last_seen
        )
        if samples:
            self._last_seen_us[key] = max(s.timestamp_us for s in samples)
        return samples

    def close(self) -> None:
        try:
            self._call(self._nvml.nvmlShutdown)
        except BackendError:
            pass  # shutting down: nothing useful to do with the failure
