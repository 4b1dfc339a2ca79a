"""The CUDA backend's logic without a GPU: sizes, operands, marks, errors (fake CUDA calls)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuguard.gpusim.errors import OutOfMemory
from gpuguard.gpusim.workload.cuda import (
    MAX_SIDE,
    CudaDevices,
    DeviceClock,
    cuda_index,
    matmul_side,
    operand_views,
    split_flops,
)


def test_matmul_sizes() -> None:
    assert matmul_side(2 * 13312**3) == 13312
    assert matmul_side(1.0) == 1
    assert split_flops(2 * 4096**3) == [4096]
    big = 2.0 * MAX_SIDE**3
    assert split_flops(2.5 * big) == [MAX_SIDE, MAX_SIDE, matmul_side(0.5 * big)]
    assert split_flops(big) == [MAX_SIDE]


def test_addresses_marks_and_operands() -> None:
    assert cuda_index("1") == 1
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES=MIG-"):
        cuda_index("0:1")
    four = 4 * 64 * 64
    assert operand_views([four, 10, four, four, four], 64) == [0, 2, 3]
    assert operand_views([four, four], 64) is None


@dataclass
class Buffer:
    size: int
    device: int


@dataclass
class FakeOps:
    """CUDA calls on a fake clock: a matmul of side N takes N^3 * 2 / rate seconds."""

    rate: float = 1e12
    capacity: int = 10**11
    clock: float = 0.0
    used: int = 0
    matmuls: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    out_of_memory: type[BaseException] = MemoryError
    sync_delay_s: float = 0.0  # the host frozen in its next sync this long

    def create_context(self, index: int) -> None:
        pass

    def empty(self, index: int, nbytes: int) -> Buffer:
        if self.used + nbytes > self.capacity:
            raise MemoryError("CUDA out of memory")
        self.used += nbytes
        return Buffer(nbytes, index)

    def pinned(self, nbytes: int) -> Buffer:
        return Buffer(nbytes, -1)

    def copy(self, dst: Buffer, src: Buffer, nbytes: int) -> None:
        assert dst.size >= nbytes and src.size >= nbytes

    def matrix(self, buffer: Buffer, side: int) -> tuple[int, int]:
        return (id(buffer), side)

    def matmul(self, index: int, a: Any, b: Any, out: Any) -> None:
        side = a[1]
        self.clock += 2.0 * side**3 / self.rate
        self.matmuls.append((index, side, (a[0], b[0], out[0])))

    def record(self, index: int) -> float:
        return self.clock

    def elapsed_ms(self, start: float, end: float) -> float:
        return (end - start) * 1000.0

    def synchronize(self, index: int) -> None:
        time.sleep(self.sync_delay_s)
        self.sync_delay_s = 0.0

    def empty_cache(self, index: int) -> None:
        pass


def test_work_seconds_follow_the_measured_throughput() -> None:
    ops = FakeOps(rate=4e12)
    devices = CudaDevices(["0"], ops)
    devices.open()
    ops.matmuls.clear()
    devices.launch(work_s=0.5)  # 2e12 flops at 4e12 flop/s
    ((_, side, _),) = ops.matmuls
    assert 2.0 * side**3 == pytest.approx(2e12, rel=0.01)


def test_oneshot_buffers_are_the_matmul_operands() -> None:
    ops = FakeOps()
    devices = CudaDevices(["0", "1"], ops)
    devices.open()
    ops.matmuls.clear()
    a, b, c = (devices.alloc(3 * 1024 * 1024 * 4 // 3) for _ in range(3))
    devices.launch(flops=2 * 1024**3)
    assert [m[0] for m in ops.matmuls] == [0, 1]  # once on each device
    assert ops.matmuls[0][2] == (id(a[0]), id(b[0]), id(c[0]))
    devices.free(c)  # too few live buffers now: scratch operands
    devices.launch(flops=2 * 1024**3)
    assert id(c[0]) not in ops.matmuls[-1][2]


def test_marks_are_the_wall_times_the_device_reached() -> None:
    ops = FakeOps(rate=2e12)
    devices = CudaDevices(["0"], ops)
    devices.open()
    first = devices.mark()
    devices.launch(flops=2e12)  # one second on the fake clock
    second = devices.mark()
    reached = devices.synchronize()
    assert reached[second] - reached[first] == pytest.approx(1.0, rel=0.01)
    assert devices.synchronize() == {}


def test_the_device_clock_takes_the_earliest_recent_sync() -> None:
    clock = DeviceClock(keep=3)
    clock.observe(100.0, 0.0)
    clock.observe(100.5, 250.0)  # a sync seen 0.25 s late (a frozen host)
    assert clock.wall(250.0) == pytest.approx(100.25)
    for at in (200.0, 300.0, 400.0):  # the first two bounds age out: the clocks drift
        clock.observe(at + 0.001, (at - 100.0) * 1000.0 - 1.0)
    assert clock.wall(1000.0) == pytest.approx(101.002)


def test_a_host_frozen_in_a_sync_does_not_move_the_marks() -> None:
    """``docker pause`` during a sync: the device was done long before the host saw it."""
    ops = FakeOps(rate=2e12)
    devices = CudaDevices(["0"], ops)
    devices.open()
    devices.launch(flops=2e10)  # 10 ms on the fake clock
    before = devices.mark()
    reached = devices.synchronize()
    devices.launch(flops=2e10)
    after = devices.mark()
    ops.sync_delay_s = 0.3
    reached |= devices.synchronize()
    assert reached[after] - reached[before] == pytest.approx(0.01, abs=0.05)


def test_library_out_of_memory_becomes_gpusims() -> None:
    devices = CudaDevices(["0"], FakeOps(capacity=2**30))
    devices.open()
    with pytest.raises(OutOfMemory):
        devices.alloc(2 * 2**30)
