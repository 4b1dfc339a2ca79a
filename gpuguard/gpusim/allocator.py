"""A caching allocator in the workload process, as PyTorch's CUDA allocator behaves.

Freed blocks are not given back to the device: they stay reserved for the next request of
a fitting size, so the device (and NVML) sees the process's memory stay up until it calls
``empty_cache()`` or exits. That is why a long-lived process's memory rarely returns to 0.
Sizes are rounded like PyTorch's: to 512 bytes, and to 2 MiB for requests of 1 MiB or more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuguard.gpusim.errors import OutOfMemory

_SMALL_ROUND = 512
_LARGE_ROUND = 2 * 2**20
_LARGE = 2**20


def rounded(size: int) -> int:
    """The block size a request of ``size`` bytes reserves."""
    unit = _LARGE_ROUND if size >= _LARGE else _SMALL_ROUND
    return -(-size // unit) * unit


@dataclass(frozen=True, eq=False)
class Block:
    """A reserved device allocation (``handle`` is the device's own)."""

    handle: int
    size: int


class CachingAllocator:
    """Reuses freed blocks (best fit); ``device_alloc``/``device_free`` reach the device."""

    def __init__(
        self, device_alloc: Callable[[int], int], device_free: Callable[[int], None]
    ) -> None:
        self._device_alloc = device_alloc
        self._device_free = device_free
        self._cached: list[Block] = []
        self._in_use: set[Block] = set()

    @property
    def reserved_bytes(self) -> int:
        """Held on the device: blocks in use plus cached ones."""
        return self.allocated_bytes + sum(b.size for b in self._cached)

    @property
    def allocated_bytes(self) -> int:
        """Held by live allocations."""
        return sum(b.size for b in self._in_use)

    def malloc(self, size: int) -> Block:
        """A block of at least ``size`` bytes: a cached one if any fits, else a new one.

        A cached block more than twice the request is not split for it (PyTorch splits;
        keeping whole blocks is simpler and reserves the same memory on the device).
        """
        need = rounded(size)
        fits = [b for b in self._cached if need <= b.size <= 2 * need]
        if fits:
            block = min(fits, key=lambda b: b.size)
            self._cached.remove(block)
        else:
            try:
                block = Block(self._device_alloc(need), need)
            except OutOfMemory:
                # Out of memory: give the cache back and try once more, as PyTorch does.
                if not self._cached:
                    raise
                self.empty_cache()
                block = Block(self._device_alloc(need), need)
        self._in_use.add(block)
        return block

    def free(self, block: Block) -> None:
        """Return a block to the cache (the device still holds it)."""
        self._in_use.remove(block)
        self._cached.append(block)

    def empty_cache(self) -> None:
        """Give every cached block back to the device (``torch.cuda.empty_cache``)."""
        cached, self._cached = self._cached, []
        for block in cached:
            self._device_free(block.handle)
