"""``Devices`` on a real NVIDIA GPU through CUDA: torch if importable, else cupy.

Nothing here imports torch or cupy until ``open()``, so the module (and its pure helpers,
which the tests cover without a GPU) loads anywhere. The library's own caching allocator
holds the memory, as in any real program. A kernel of ``work_s`` seconds is one float32
matmul sized from the device's throughput, measured once when the device opens; a kernel
of ``flops`` is the matmul of that many flops (2 N^3). Its operands are views of three live
allocations when they are large enough (the oneshot task's A, B and C), else scratch
matrices kept for the process's life. Marks are CUDA events; their wall times come from
each event's distance to an anchor event recorded when the device opened, put on the host's
clock by ``DeviceClock``.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuguard.gpusim.errors import OutOfMemory

_CALIBRATION_SIDE = 2048
_CALIBRATION_RUNS = 5
#: Largest matmul side one kernel uses; more work becomes several kernels.
MAX_SIDE = 16384


def matmul_side(flops: float) -> int:
    """Side N of the square matmul closest to ``flops`` (2 N^3), at least 1."""
    return max(1, round((flops / 2.0) ** (1.0 / 3.0)))


def split_flops(flops: float, max_side: int = MAX_SIDE) -> list[int]:
    """Matmul sides of the kernels that do ``flops`` of work, none above ``max_side``."""
    largest = 2.0 * float(max_side) ** 3
    sides = [max_side] * int(flops // largest)
    rest = flops - len(sides) * largest
    if rest > 0 and (not sides or matmul_side(rest) > 1):
        sides.append(matmul_side(rest))
    return sides


def cuda_index(address: str) -> int:
    """The CUDA device index of a workload address; MIG needs CUDA_VISIBLE_DEVICES."""
    if not address.isdigit():
        raise ValueError(
            f"device {address!r}: with --backend cuda give a CUDA index; for a MIG device, "
            "set CUDA_VISIBLE_DEVICES=MIG-<uuid> and use device 0"
        )
    return int(address)


class DeviceClock:
    """The device's event times (ms since an anchor event) on the host's wall clock.

    Each sync bounds the offset between the clocks from above: the sync's final event was
    done by the time the host saw it return. A host that was frozen (``docker pause``) or
    descheduled in the sync sees it late, so the offset is the least of the recent bounds,
    not the last one; only the recent ``keep``, so the clocks' drift does not build up.
    """

    def __init__(self, keep: int = 32) -> None:
        self._bounds: deque[float] = deque(maxlen=keep)

    def observe(self, sync_wall: float, final_ms: float) -> None:
        """A sync returned at ``sync_wall`` with its final event at ``final_ms``."""
        self._bounds.append(sync_wall - final_ms / 1000.0)

    def wall(self, ms: float) -> float:
        """The wall time of a device time ``ms``; needs one ``observe`` first."""
        return min(self._bounds) + ms / 1000.0


def operand_views(sizes: Sequence[int], side: int) -> list[int] | None:
    """Indexes of the first three allocations that hold a ``side`` x ``side`` float32 matrix."""
    need = side * side * 4
    fitting = [i for i, size in enumerate(sizes) if size >= need]
    return fitting[:3] if len(fitting) >= 3 else None


class TorchOps:
    """The CUDA calls ``CudaDevices`` makes, through torch."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.out_of_memory: type[BaseException] = torch.cuda.OutOfMemoryError

    def create_context(self, index: int) -> None:
        self.torch.cuda.set_device(index)
        self.torch.zeros(1, device=f"cuda:{index}")  # the first CUDA op creates the context
        self.torch.cuda.synchronize(index)

    def empty(self, index: int, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=f"cuda:{index}")

    def pinned(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)

    def copy(self, dst: Any, src: Any, nbytes: int) -> None:
        dst[:nbytes].copy_(src[:nbytes], non_blocking=True)

    def matrix(self, buffer: Any, side: int) -> Any:
        return buffer[: side * side * 4].view(self.torch.float32).view(side, side)

    def matmul(self, index: int, a: Any, b: Any, out: Any) -> None:
        with self.torch.cuda.device(index):
            self.torch.mm(a, b, out=out)

    def record(self, index: int) -> Any:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record(self.torch.cuda.current_stream(index))
        return event

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))

    def synchronize(self, index: int) -> None:
        self.torch.cuda.synchronize(index)

    def empty_cache(self, index: int) -> None:
        with self.torch.cuda.device(index):
            self.torch.cuda.empty_cache()


class CupyOps:
    """The same calls through cupy (and its memory pool)."""

    def __init__(self, cupy: Any) -> None:
        self.cp = cupy
        self.out_of_memory: type[BaseException] = cupy.cuda.memory.OutOfMemoryError

    def create_context(self, index: int) -> None:
        with self.cp.cuda.Device(index) as device:
            self.cp.zeros(1)
            device.synchronize()

    def empty(self, index: int, nbytes: int) -> Any:
        with self.cp.cuda.Device(index):
            return self.cp.empty(nbytes, dtype=self.cp.uint8)

    def pinned(self, nbytes: int) -> Any:
        import cupyx

        return cupyx.empty_pinned((nbytes,), dtype="uint8")

    def copy(self, dst: Any, src: Any, nbytes: int) -> None:
        if isinstance(dst, self.cp.ndarray):
            dst[:nbytes].set(src[:nbytes])
        else:
            src[:nbytes].get(out=dst[:nbytes])

    def matrix(self, buffer: Any, side: int) -> Any:
        return buffer[: side * side * 4].view(self.cp.float32).reshape(side, side)

    def matmul(self, index: int, a: Any, b: Any, out: Any) -> None:
        with self.cp.cuda.Device(index):
            self.cp.matmul(a, b, out=out)

    def record(self, index: int) -> Any:
        with self.cp.cuda.Device(index):
            event = self.cp.cuda.Event()
            event.record()
            return event

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self.cp.cuda.get_elapsed_time(start, end))

    def synchronize(self, index: int) -> None:
        self.cp.cuda.Device(index).synchronize()

    def empty_cache(self, index: int) -> None:
        self.cp.get_default_memory_pool().free_all_blocks()


def load_ops() -> TorchOps | CupyOps:
    """torch if it imports, else cupy; ImportError when neither does."""
    try:
        return TorchOps(importlib.import_module("torch"))
    except ImportError:
        pass
    try:
        return CupyOps(importlib.import_module("cupy"))
    except ImportError:
        raise ImportError("--backend cuda needs torch or cupy") from None


@dataclass
class _Device:
    index: int
    flops_per_s: float = 0.0
    live: list[Any] = field(default_factory=list)  # allocations, oldest first
    scratch: dict[int, list[Any]] = field(default_factory=dict)  # side -> A, B, C
    staging: Any = None  # device buffer copies land in
    marks: dict[int, Any] = field(default_factory=dict)
    anchor: Any = None  # the event device times are measured from
    clock: DeviceClock = field(default_factory=DeviceClock)


class CudaDevices:
    """``Devices`` on real GPUs (see the module docstring)."""

    def __init__(self, addresses: Sequence[str], ops: Any = None) -> None:
        self.addresses = tuple(addresses)
        self._devices = [_Device(cuda_index(a)) for a in self.addresses]
        self._ops = ops
        self._host: Any = None
        self._next_mark = 0

    @property
    def ops(self) -> Any:
        if self._ops is None:
            self._ops = load_ops()
        return self._ops

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """The library's out-of-memory error becomes gpusim's, as the workload expects."""
        try:
            yield
        except Exception as exc:
            if isinstance(exc, self.ops.out_of_memory):
                raise OutOfMemory("out_of_memory", str(exc)) from exc
            raise

    def open(self) -> None:
        with self._translated():
            for device in self._devices:
                self.ops.create_context(device.index)
                device.anchor = self.ops.record(device.index)
                self.ops.synchronize(device.index)
                device.clock.observe(time.time(), 0.0)
                device.flops_per_s = self._calibrate(device)

    def _calibrate(self, device: _Device) -> float:
        """Throughput of one matmul on this device, from CUDA events (float32 flop/s)."""
        side = _CALIBRATION_SIDE
        operands = self._operands(device, side)
        self.ops.matmul(device.index, *operands)  # warm-up: kernels load, clocks rise
        start = self.ops.record(device.index)
        for _ in range(_CALIBRATION_RUNS):
            self.ops.matmul(device.index, *operands)
        end = self.ops.record(device.index)
        self.ops.synchronize(device.index)
        seconds = self.ops.elapsed_ms(start, end) / 1000.0
        return _CALIBRATION_RUNS * 2.0 * side**3 / max(seconds, 1e-9)

    def _operands(self, device: _Device, side: int) -> list[Any]:
        views = operand_views([_size(b) for b in device.live], side)
        if views is not None:
            return [self.ops.matrix(device.live[i], side) for i in views]
        if side not in device.scratch:
            device.scratch[side] = [
                self.ops.matrix(self.ops.empty(device.index, side * side * 4), side)
                for _ in range(3)
            ]
        return device.scratch[side]

    def alloc(self, nbytes: int) -> list[Any]:
        with self._translated():
            buffers = [self.ops.empty(d.index, nbytes) for d in self._devices]
        for device, buffer in zip(self._devices, buffers, strict=True):
            device.live.append(buffer)
        return buffers

    def free(self, buffer: list[Any]) -> None:
        for device, b in zip(self._devices, buffer, strict=True):
            device.live = [x for x in device.live if x is not b]

    def empty_cache(self) -> None:
        for device in self._devices:
            device.scratch.clear()
            device.staging = None
            self.ops.empty_cache(device.index)

    def _copy(self, nbytes: int, to_device: bool) -> None:
        if self._host is None or _size(self._host) < nbytes:
            self._host = self.ops.pinned(nbytes)
        for device in self._devices:
            if device.staging is None or _size(device.staging) < nbytes:
                device.staging = self.ops.empty(device.index, nbytes)
            if to_device:
                self.ops.copy(device.staging, self._host, nbytes)
            else:
                self.ops.copy(self._host, device.staging, nbytes)
        for device in self._devices:  # cudaMemcpy returns when the copy is done
            self.ops.synchronize(device.index)

    def copy_in(self, nbytes: int) -> None:
        with self._translated():
            self._copy(nbytes, to_device=True)

    def copy_out(self, nbytes: int) -> None:
        with self._translated():
            self._copy(nbytes, to_device=False)

    def launch(self, work_s: float | None = None, flops: float | None = None) -> None:
        if (work_s is None) == (flops is None):
            raise ValueError("give exactly one of work_s or flops")
        with self._translated():
            for device in self._devices:
                amount = flops if flops is not None else (work_s or 0.0) * device.flops_per_s
                for side in split_flops(amount):
                    self.ops.matmul(device.index, *self._operands(device, side))

    def mark(self) -> int:
        self._next_mark += 1
        for device in self._devices:
            device.marks[self._next_mark] = self.ops.record(device.index)
        return self._next_mark

    def synchronize(self) -> dict[int, float]:
        times: dict[int, float] = {}
        for device in self._devices:
            final = self.ops.record(device.index)
            self.ops.synchronize(device.index)
            device.clock.observe(time.time(), self.ops.elapsed_ms(device.anchor, final))
            for mark, event in device.marks.items():
                wall = device.clock.wall(self.ops.elapsed_ms(device.anchor, event))
                times[mark] = max(times.get(mark, wall), wall)
            device.marks.clear()
        return times

    def close(self) -> None:
        """Drop every buffer; the CUDA context itself lives until the process exits."""
        for device in self._devices:
            device.live.clear()
        self.empty_cache()


def _size(buffer: Any) -> int:
    return int(buffer.numel()) if hasattr(buffer, "numel") else int(buffer.size)
