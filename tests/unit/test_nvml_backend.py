from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpuguard.exporter.backends.base import open_backend
from gpuguard.exporter.backends.nvml import NvmlBackend
from gpuguard.exporter.errors import BackendError, BackendUnavailable
from tests.unit.fake_pynvml import (
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    FakeDevice,
    FakeNvml,
)


def test_devices_processes_and_utilization() -> None:
    dev = FakeDevice(
        "GPU-aaaa", used=3 * 2**30, gpu_util=100,
        processes=[(4242, 2**30), (4343, None)],
        samples=[(4242, 1_000, 80, 10), (4242, 2_000, 60, 10)],
    )  # fmt: skip
    nvml = FakeNvml([dev])
    backend = NvmlBackend(nvml)
    assert nvml.initialised == 1
    (d,) = backend.sample().devices
    assert (d.index, d.uuid, d.name, d.key) == (0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", "0")
    assert d.memory_used_bytes == 3 * 2**30 and d.memory_total_bytes == 80 * 2**30
    assert d.utilization_ratio == 1.0
    assert [(p.pid, p.used_memory_bytes) for p in d.processes] == [(4242, 2**30), (4343, None)]
    assert [(s.timestamp_us, s.sm_ratio) for s in d.process_samples] == [(1000, 0.8), (2000, 0.6)]
    backend.close()
    assert nvml.initialised == 0


def test_each_device_keeps_its_own_identity_with_fresh_handles() -> None:
    # pynvml returns a new handle object on every call; a dead handle's id() is soon reused
    # by the next one, so identity cached by id(handle) hands one GPU's UUID to another.
    devices = [FakeDevice(f"GPU-{i}", name=f"gpu model {i}") for i in range(4)]
    nvml = FakeNvml(devices)
    backend = NvmlBackend(nvml)
    assert nvml.nvmlDeviceGetHandleByIndex(0) is not nvml.nvmlDeviceGetHandleByIndex(0)
    for _ in range(5):
        sample = backend.sample()
        assert [(d.uuid, d.name) for d in sample.devices] == [
            (f"GPU-{i}", f"gpu model {i}") for i in range(4)
        ]


def test_last_seen_timestamp_is_passed_and_not_found_means_no_samples() -> None:
    dev = FakeDevice("GPU-a", processes=[(1, 10)], samples=[(1, 500, 50, 0)])
    nvml = FakeNvml([dev])
    backend = NvmlBackend(nvml)
    assert len(backend.sample().devices[0].process_samples) == 1
    # nothing newer than 500: NVML raises NOT_FOUND, which is "no samples", not an error
    assert backend.sample().devices[0].process_samples == ()
    dev.samples.append((1, 900, 20, 0))
    assert [s.timestamp_us for s in backend.sample().devices[0].process_samples] == [900]
    stamps = [ts for name, ts in nvml.calls if name == "nvmlDeviceGetProcessUtilization"]
    assert stamps == [0, 500, 500]
    assert nvml.initialised == 1  # initialised once, not per sample


def test_process_utilization_not_supported_is_empty() -> None:
    dev = FakeDevice("GPU-a", processes=[(1, 10)], process_utilization_supported=False)
    assert NvmlBackend(FakeNvml([dev])).sample().devices[0].process_samples == ()


def test_mig_devices_listed_with_their_processes() -> None:
    child0 = FakeDevice(
        "MIG-0", name="MIG 1g.10gb", total=10 * 2**30, processes=[(7, 2**20)], gpu_instance_id=9
    )
    child2 = FakeDevice("MIG-2", name="MIG 1g.10gb", total=10 * 2**30)
    parent = FakeDevice(
        "GPU-p", processes=[(7, 2**20)], mig_mode=NVML_DEVICE_MIG_ENABLE,
        mig_slots=[child0, None, child2],
    )  # fmt: skip
    devices = NvmlBackend(FakeNvml([parent, FakeDevice("GPU-q")])).sample().devices
    assert [(d.key, d.uuid) for d in devices] == [
        ("0", "GPU-p"),
        ("0:0", "MIG-0"),
        ("0:2", "MIG-2"),
        ("1", "GPU-q"),
    ]
    assert devices[0].processes == ()  # listed on its MIG device, not twice
    assert [p.pid for p in devices[1].processes] == [7]
    assert devices[0].utilization_ratio is None and devices[1].utilization_ratio is None
    assert devices[3].utilization_ratio == 0.0
    # dcgm-exporter's GPU_I_ID and GPU_I_PROFILE; an instance id NVML cannot give is absent
    assert [(d.gpu_instance_id, d.mig_profile) for d in devices] == [
        (None, None), (9, "1g.10gb"), (None, "1g.10gb"), (None, None),
    ]  # fmt: skip


@pytest.mark.parametrize("code", [NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_driver_is_unavailable(code: int) -> None:
    with pytest.raises(BackendUnavailable, match="nvmlInit"):
        NvmlBackend(FakeNvml([], init_error=code))


def test_driver_errors_become_backend_errors() -> None:
    dev = FakeDevice("GPU-a")
    backend = NvmlBackend(FakeNvml([dev]))
    dev.lost = True
    with pytest.raises(BackendError, match="GPU is lost") as info:
        backend.sample()
    assert not isinstance(info.value, BackendUnavailable)
    dev.lost = False
    assert len(backend.sample().devices) == 1  # and it recovers


def test_auto_prefers_nvml_then_gpusim_then_fails(tmp_path: Path) -> None:
    nvml = FakeNvml([FakeDevice("GPU-a")])
    assert open_backend("auto", tmp_path / "none.sock", nvml).name == "nvml"
    broken = FakeNvml([], init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    sock = tmp_path / "gpusim.sock"
    with socket.socket(socket.AF_UNIX) as listener:  # a socket file (a plain one is refused)
        listener.bind(str(sock))
    assert open_backend("auto", sock, broken).name == "gpusim"
    with pytest.raises(BackendUnavailable, match="no GPU backend") as err:
        open_backend("auto", tmp_path / "none.sock", broken)
    # ... and says what to do: install the driver, or start gpusim where it looks
    assert "install its driver" in str(err.value)
    assert f"`gpusim serve --socket {tmp_path / 'none.sock'}`" in str(err.value)
    assert "\n" not in str(err.value)


def test_nvml_asked_for_and_failing_says_what_to_do(tmp_path: Path) -> None:
    broken = FakeNvml([], init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(BackendUnavailable, match=r"^--gpu.backend nvml: .*install its driver"):
        open_backend("nvml", tmp_path / "none.sock", broken)


def test_real_pynvml_without_a_driver_is_unavailable() -> None:
    # This machine has no NVIDIA driver: the real module must fail cleanly at init.
    try:
        backend = NvmlBackend()
    except BackendUnavailable:
        return
    backend.close()  # a GPU machine: fine too
