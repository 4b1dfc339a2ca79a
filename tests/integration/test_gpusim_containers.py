"""gpusim with real workloads in real containers on a private dockerd.

What the simulated GPU must get right for gpuguard: host PIDs of container processes,
contention between containers, a paused container that stops issuing GPU work, memory that
runs out like cudaMalloc, and memory freed when a container is killed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gpusim_support import (
    exit_code,
    gpusim_status,
    kernel_s,
    mounts,
    read_events,
    wait_event,
    workload,
)

from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.gpusim.client import GpusimClient
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

SCALE = 0.05
WORK = 10.0  # device-seconds: 0.5 s alone at SCALE
SMALL = "30MiB"  # A+B+C of a workload whose copies do not matter


def test_two_containers_slow_each_other_down(
    gpusim_daemon: Callable[..., GpusimService], run_python_container: Callable[..., Any]
) -> None:
    sim = gpusim_daemon(time_scale=SCALE, copy_time_scale=SCALE)
    args = ["--work-seconds", str(WORK), "--memory-bytes", SMALL]
    alone = run_python_container(workload(sim, "alone", *args), extra_mounts=mounts(sim))
    assert exit_code(alone) == 0
    alone_s = kernel_s(read_events(sim, "alone"))
    assert alone_s == pytest.approx(WORK * SCALE, rel=0.1)

    start_at = str(time.time() + 3.0)  # both containers are up by then
    pair = [
        run_python_container(
            workload(sim, name, *args, "--start-at", start_at), extra_mounts=mounts(sim)
        )
        for name in ("a", "b")
    ]
    assert [exit_code(c) for c in pair] == [0, 0]
    a, b = read_events(sim, "a"), read_events(sim, "b")
    assert a["kernel_start"]["t"] < b["kernel_end"]["t"]  # they really overlapped
    assert b["kernel_start"]["t"] < a["kernel_end"]["t"]
    for events in (a, b):
        # Time-slicing: about 2 x alone plus paper B's overhead (23.27 / 10.80 = 2.16 x).
        assert kernel_s(events) > 1.6 * alone_s


def test_pause_during_input_delays_only_the_paused_kernel(
    gpusim_daemon: Callable[..., GpusimService],
    run_python_container: Callable[..., Any],
) -> None:
    # Copies at real length: 12 GiB of matrices means 8 GiB in, about 1.1 s alone.
    sim = gpusim_daemon(time_scale=SCALE)
    paused = run_python_container(
        workload(sim, "paused", "--work-seconds", str(WORK), "--memory-bytes", "12GiB"),
        extra_mounts=mounts(sim),
    )
    wait_event(sim, "paused", "input_start")
    paused.pause()
    paused_at = time.time()
    try:
        other = run_python_container(
            workload(sim, "other", "--work-seconds", str(WORK), "--memory-bytes", SMALL),
            extra_mounts=mounts(sim),
        )
        assert exit_code(other) == 0
        assert "input_end" not in read_events(sim, "paused")  # frozen: no further chunks
    finally:
        paused.unpause()
    resumed_at = time.time()
    assert exit_code(paused) == 0
    p, o = read_events(sim, "paused"), read_events(sim, "other")
    # The other container's kernel ran alone, at full single-task speed.
    assert kernel_s(o) == pytest.approx(WORK * SCALE, rel=0.1)
    # The paused one's input stopped while frozen, so its kernel came after the other's.
    assert p["input_end"]["t"] > resumed_at
    assert p["input_end"]["t"] - p["input_start"]["t"] > resumed_at - paused_at
    assert p["kernel_start"]["t"] > o["kernel_end"]["t"]
    assert kernel_s(p) == pytest.approx(WORK * SCALE, rel=0.1)


def test_allocation_beyond_device_memory_fails_in_the_container(
    gpusim_daemon: Callable[..., GpusimService], run_python_container: Callable[..., Any]
) -> None:
    sim = gpusim_daemon(device="name=small,memory=1GiB", time_scale=SCALE)
    container = run_python_container(
        workload(sim, "oom", "--size", "13312"), extra_mounts=mounts(sim)
    )
    assert exit_code(container) == 3
    events = read_events(sim, "oom")
    assert events["error"]["error"] == "out_of_memory"
    assert "kernel_start" not in events
    with GpusimClient(sim.socket) as client:
        assert client.sample()["devices"][0]["memory_used_bytes"] == 0


def test_status_shows_host_pids_and_a_killed_container_frees_its_memory(
    gpusim_daemon: Callable[..., GpusimService], run_python_container: Callable[..., Any]
) -> None:
    sim = gpusim_daemon(time_scale=SCALE)
    args = ["--work-seconds", "10000", "--memory-bytes", "3GiB"]
    containers = [
        run_python_container(workload(sim, name, *args), extra_mounts=mounts(sim))
        for name in ("k1", "k2")
    ]
    for name in ("k1", "k2"):
        wait_event(sim, name, "kernel_start")
    device = gpusim_status(sim)["devices"][0]
    by_pid = {p["pid"]: p for p in device["processes"]}
    for container in containers:
        container.reload()
        host_pid = container.attrs["State"]["Pid"]
        # The container's own PID 1 is this python, and gpusim knows it by its host PID.
        assert by_pid[host_pid]["phase"] == "kernel"
        assert by_pid[host_pid]["used_memory_bytes"] == 300 * 2**20 + 3 * 2**30
        assert container.id in Path(f"/proc/{host_pid}/cgroup").read_text()
    assert device["utilization_ratio"] == 1.0

    killed, kept = containers
    killed_pid = killed.attrs["State"]["Pid"]
    killed.kill()
    assert exit_code(killed) == 137

    def freed() -> bool:
        pids = [p["pid"] for p in gpusim_status(sim)["devices"][0]["processes"]]
        return killed_pid not in pids

    wait_for(freed, 10, interval=0.02)
    device = gpusim_status(sim)["devices"][0]
    assert [p["pid"] for p in device["processes"]] == [kept.attrs["State"]["Pid"]]
    assert device["memory_used_bytes"] == 300 * 2**20 + 3 * 2**30
