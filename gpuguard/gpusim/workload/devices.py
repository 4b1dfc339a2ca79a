"""The GPU a workload sees: one or more devices driven together, on gpusim or CUDA.

Every kind is written once against ``Devices``; ``SimDevices`` speaks to gpusim and
``cuda.CudaDevices`` to a real GPU. With several devices every call acts on all of them at
once (data parallel): a copy returns when every device has done it, and a mark's time is
when the last device reached it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gpuguard.gpusim.allocator import Block, CachingAllocator
from gpuguard.gpusim.client import GpusimClient, default_socket_path
from gpuguard.gpusim.driver import CallKind, DriverCalls, find_stub

T = TypeVar("T")


class Devices(Protocol):
    """What a workload does with its GPU(s); see the module docstring."""

    addresses: tuple[str, ...]

    def open(self) -> None:
        """Create a context on every device."""

    def alloc(self, nbytes: int) -> Any:
        """Allocate ``nbytes`` on every device through the caching allocator."""

    def free(self, buffer: Any) -> None:
        """Give an allocation back to the allocator's cache (the device keeps it)."""

    def empty_cache(self) -> None:
        """Give cached memory back to the devices."""

    def copy_in(self, nbytes: int) -> None:
        """Host to device, synchronous (after every op launched before it)."""

    def copy_out(self, nbytes: int) -> None:
        """Device to host, synchronous."""

    def launch(self, work_s: float | None = None, flops: float | None = None) -> None:
        """Launch one kernel asynchronously: ``work_s`` seconds of the GPU, or ``flops``."""

    def mark(self) -> int:
        """Record an event after the ops launched so far; its time comes from ``synchronize``."""

    def synchronize(self) -> dict[int, float]:
        """Wait for every launched op; wall time each mark since the last call was reached."""

    def close(self) -> None:
        """Destroy the contexts (all memory goes back)."""


class SimDevices:
    """``Devices`` on a gpusim daemon: one connection (context) per device, one PID.

    Where the daemon put its driver stand-in beside its socket, each launch, copy and wait
    runs inside the matching CUDA driver entry point (``gpuguard/gpusim/driver.py``).
    """

    def __init__(self, socket: Path | None, addresses: Sequence[str]) -> None:
        self.socket = socket
        self.addresses = tuple(addresses)
        self._clients: list[GpusimClient] = []
        self._allocators: list[CachingAllocator] = []
        self._marks: dict[int, list[int]] = {}  # mark -> event id on each device
        self._next_mark = 0
        self._driver: DriverCalls | None = None

    def _in_driver(self, kind: CallKind, action: Callable[[], T]) -> T:
        return action() if self._driver is None else self._driver.call(kind, action)

    def open(self) -> None:
        self._driver = find_stub(self.socket or default_socket_path())
        for address in self.addresses:
            client = GpusimClient(self.socket)
            self._clients.append(client)
            client.context_create(address)
            self._allocators.append(CachingAllocator(client.alloc, client.free))

    def _all(self, op: str, **args: Any) -> list[dict[str, Any]]:
        # Sent to every device before any reply is read, so the devices work at once.
        for client in self._clients:
            client.send(op, **args)
        return [client.receive() for client in self._clients]

    def alloc(self, nbytes: int) -> list[Block]:
        return [allocator.malloc(nbytes) for allocator in self._allocators]

    def free(self, buffer: list[Block]) -> None:
        for allocator, block in zip(self._allocators, buffer, strict=True):
            allocator.free(block)

    def empty_cache(self) -> None:
        for allocator in self._allocators:
            allocator.empty_cache()

    def _copy(self, kind: CallKind, op: str, nbytes: int) -> None:
        # an asynchronous copy, then the wait for it: as cudaMemcpy does on a stream
        self._in_driver(kind, lambda: self._send(op, bytes=nbytes))
        self._in_driver(CallKind.WAIT, self._receive)

    def copy_in(self, nbytes: int) -> None:
        self._copy(CallKind.COPY, "copy_in", nbytes)

    def copy_out(self, nbytes: int) -> None:
        self._copy(CallKind.COPY_OUT, "copy_out", nbytes)

    def _send(self, op: str, **args: Any) -> None:
        for client in self._clients:
            client.send(op, **args)

    def _receive(self) -> list[dict[str, Any]]:
        return [client.receive() for client in self._clients]

    def launch(self, work_s: float | None = None, flops: float | None = None) -> None:
        if (work_s is None) == (flops is None):
            raise ValueError("give exactly one of work_s or flops")
        size = {"work": work_s} if work_s is not None else {"flops": flops}
        self._in_driver(CallKind.LAUNCH, lambda: self._all("launch", **size))

    def mark(self) -> int:
        self._next_mark += 1
        self._marks[self._next_mark] = [int(r["event"]) for r in self._all("event_record")]
        return self._next_mark

    def synchronize(self) -> dict[int, float]:
        replies = self._in_driver(CallKind.WAIT, lambda: self._all("synchronize"))
        reached = [{int(e["id"]): float(e["t"]) for e in r["events"]} for r in replies]
        times = {}
        for mark, ids in self._marks.items():
            per_device = [events.get(i) for events, i in zip(reached, ids, strict=True)]
            if all(t is not None for t in per_device):
                times[mark] = max(t for t in per_device if t is not None)
        self._marks.clear()
        return times

    def close(self) -> None:
        clients, self._clients, self._allocators = self._clients, [], []
        for client in clients:
            client.close()  # the daemon frees the context and its memory at once
