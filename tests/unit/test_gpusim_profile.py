"""Device profiles (the contention model's parameters as JSON) and the caching allocator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuguard.gpusim.allocator import CachingAllocator, rounded
from gpuguard.gpusim.config import DaemonConfig
from gpuguard.gpusim.contention import matmul_flops
from gpuguard.gpusim.errors import OutOfMemory
from gpuguard.gpusim.profile import default_profile, load_profile, parse_profile
from gpuguard.slowdown import PAPER_B_KERNEL_S, PAPER_B_SIZE


def test_paper_b_profile_is_paper_b_table() -> None:
    profile = default_profile()
    assert profile.name == "paper-b"
    assert profile.concurrent_kernel_s == PAPER_B_KERNEL_S
    assert profile.reference_matmul_size == PAPER_B_SIZE
    # A 13,312^2 matmul takes paper B's single-task kernel time on its own.
    assert matmul_flops(PAPER_B_SIZE) / profile.flops_per_s == pytest.approx(10.795)
    assert profile.memory_bytes == 24 * 2**30 and profile.context_memory_bytes == 300 * 2**20
    assert parse_profile(json.loads(json.dumps(profile.to_json()))) == profile


def test_the_h200_profile_is_the_one_the_truth_kit_fitted_on_the_device() -> None:
    """Shipped as measured (bench/results/): a kernel alone, the sample period, the copies."""
    profile = load_profile("nvidia-h200")
    fitted = Path(__file__).resolve().parents[2] / "bench/results/profile-nvidia-h200.json"
    assert profile == parse_profile(json.loads(fitted.read_text()))
    assert profile.concurrent_kernel_s[0] == pytest.approx(0.0928)
    assert profile.sample_period_s == pytest.approx(0.2, abs=0.001)
    assert profile.copy_in_bytes_per_s > profile.copy_out_bytes_per_s > 4e10


def test_a_profile_file_is_loaded_by_path(tmp_path: Path) -> None:
    doc = default_profile().to_json() | {
        "name": "h100",
        "concurrent_kernel_s": [0.1, 0.21],
        "memory": "80GiB",
    }
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(doc))
    profile = load_profile(str(path))
    assert profile.name == "h100" and profile.memory_bytes == 80 * 2**30
    assert profile.slowdown_factor(2) == pytest.approx(1.05)
    assert profile.slowdown_factor(5) == pytest.approx(1.05)  # held beyond the curve


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": 2}, "format"),
        ({"concurrent_kernel_s": []}, "concurrent_kernel_s"),
        ({"concurrent_kernel_s": [1.0, -2.0]}, "concurrent_kernel_s"),
        ({"copy_in_bytes_per_s": "fast"}, "copy_in_bytes_per_s"),
        ({"launch_queue_depth": 1.5}, "launch_queue_depth"),
        ({"memory": "lots"}, "invalid size"),
        ({"name": ""}, "name"),
        ({"colour": "green"}, "unknown profile keys: colour"),
    ],
)
def test_bad_profiles_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_profile(default_profile().to_json() | change)


def test_unknown_profile_names_the_shipped_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shipped: nvidia-h200, paper-b"):
        load_profile("h900")
    with pytest.raises(ValueError, match="cannot read"):
        load_profile(str(tmp_path / "none.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="invalid JSON"):
        load_profile(str(tmp_path / "bad.json"))


class FakeDevice:
    """cudaMalloc/cudaFree with a capacity."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.live: dict[int, int] = {}
        self.calls = 0

    def alloc(self, size: int) -> int:
        if sum(self.live.values()) + size > self.capacity:
            raise OutOfMemory("out_of_memory", "full")
        self.calls += 1
        self.live[self.calls] = size
        return self.calls

    def free(self, handle: int) -> None:
        del self.live[handle]


def test_caching_allocator_keeps_memory_until_empty_cache() -> None:
    device = FakeDevice(capacity=100 * 2**20)
    cache = CachingAllocator(device.alloc, device.free)
    block = cache.malloc(10 * 2**20)
    cache.free(block)
    assert sum(device.live.values()) == 10 * 2**20  # the device still holds it
    assert (cache.reserved_bytes, cache.allocated_bytes) == (10 * 2**20, 0)
    again = cache.malloc(9 * 2**20)  # fits the cached block: no new device allocation
    assert again is block and device.calls == 1
    cache.free(again)
    small = cache.malloc(1000)  # far smaller than the cached block: a new small one
    assert small.size == rounded(1000) == 1024 and device.calls == 2
    cache.free(small)
    cache.empty_cache()
    assert device.live == {} and cache.reserved_bytes == 0


def test_caching_allocator_frees_its_cache_before_failing() -> None:
    device = FakeDevice(capacity=64 * 2**20)
    cache = CachingAllocator(device.alloc, device.free)
    cache.free(cache.malloc(40 * 2**20))
    big = cache.malloc(60 * 2**20)  # needs the cached 40 MiB back
    assert device.live == {big.handle: 60 * 2**20}
    with pytest.raises(OutOfMemory):
        cache.malloc(10 * 2**20)
    assert rounded(2**20 + 1) == 2 * 2**20


def test_config_defaults_are_the_default_profiles() -> None:
    config, profile = DaemonConfig(), default_profile()
    assert config.profile == profile
    assert config.context_memory_bytes == profile.context_memory_bytes
    assert config.sample_period_s == pytest.approx(profile.sample_period_s)
    assert config.launch_queue_depth == profile.launch_queue_depth
    assert config.devices[0].memory_bytes == profile.memory_bytes
