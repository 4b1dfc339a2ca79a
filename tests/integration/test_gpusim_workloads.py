"""Every workload kind in real containers on a real gpusim daemon: server, train, two GPUs, MIG.

The train container is frozen with ``docker pause``: it launches nothing more, and the
device stays busy only until the kernels it had queued have drained.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest
from gpusim_support import (
    exit_code,
    host_pid,
    kernel_s,
    mounts,
    read_log,
    wait_event,
    workload,
)

from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.scenario import SCENARIO_LABEL, Scenario, WorkloadSpec
from gpuguard.gpusim.client import GpusimClient
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

SCALE = 0.05


def of(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def test_inference_server_uses_about_30_percent_of_the_gpu(
    gpusim_daemon: Callable[..., GpusimService], run_python_container: Callable[..., Any]
) -> None:
    sim = gpusim_daemon(time_scale=SCALE, sample_period=0.5)
    # 10 requests/s x 0.6 s of GPU work each x time scale 0.05 = 30% of the GPU.
    args = ["server", "--rate", "10", "--arrivals", "fixed", "--requests", "30"]
    args += ["--request-work", "0.6", "--io-bytes", "64KiB"]
    server = run_python_container(workload(sim, "srv", *args), extra_mounts=mounts(sim))
    wait_event(sim, "srv", "ready")
    utilization = []
    with GpusimClient(sim.socket) as observer:
        time.sleep(0.5)
        for _ in range(4):  # four 0.5 s windows in the middle of the run
            device = observer.sample()["devices"][0]
            utilization.append(device["utilization_ratio"])
            assert [p["pid"] for p in device["processes"]] == [host_pid(server)]
            time.sleep(0.5)
    assert exit_code(server) == 0
    assert statistics.fmean(utilization) == pytest.approx(0.3, abs=0.08)
    events = read_log(sim, "srv")
    requests = of(events, "request")
    assert len(requests) == 30 and events[-1]["event"] == "summary"
    for req in requests:
        assert req["pid"] != host_pid(server)  # its own PID namespace: PID 1 in there
        assert req["arrival"] <= req["start"] < req["end"]
        assert req["end"] - req["start"] >= 0.6 * SCALE


def test_training_loop_paused_stops_once_its_queue_drains(
    gpusim_daemon: Callable[..., GpusimService], run_python_container: Callable[..., Any]
) -> None:
    sim = gpusim_daemon(time_scale=SCALE, sample_period=0.05)
    # Steps of 4 kernels x 12.5 ms; the loop runs up to 20 steps (1 s) ahead of the device.
    args = ["train", "--steps", "100000", "--step-work", "1.0", "--kernels", "4"]
    args += ["--sync-every", "20"]
    train = run_python_container(workload(sim, "train", *args), extra_mounts=mounts(sim))
    pid = host_pid(train)
    wait_event(sim, "train", "sync")
    each_kernel_s = 1.0 / 4 * SCALE
    with GpusimClient(sim.socket) as observer:

        def me(status: dict[str, Any]) -> dict[str, Any]:
            (process,) = status["devices"][0]["processes"]
            assert process["pid"] == pid
            return process  # type: ignore[no-any-return]

        train.pause()
        asked = time.time()
        queued = me(observer.status())["kernels_queued"]
        paused_at = time.time()  # the queue was counted between these two
        counted_within = paused_at - asked
        # The last period the device ran it in: its sample is the newest with its PID once
        # the device has been quiet for 0.3 s (a launch the process sent just before the
        # freeze may reach the device after the queue looked empty: that one runs too).
        last_us = [int(paused_at * 1e6)]

        def quiet() -> bool:
            device = observer.sample(since_us=last_us[-1])["devices"][0]
            last_us.extend(s["timestamp_us"] for s in device["process_samples"] if s["pid"] == pid)
            idle = me(observer.status())["phase"] == "idle"
            return idle and time.time() - last_us[-1] / 1e6 >= 0.3

        wait_for(quiet, timeout=10, interval=0.02, what="the device quiet after the freeze")
        drained_at = last_us[-1] / 1e6
        drain_s = drained_at - paused_at
        print(f"\nfrozen with {queued} kernels queued; SM activity stopped {drain_s:.3f} s later")
        # The device finished what was queued at the pause (and at most one launch in
        # flight), then went idle.
        assert drain_s == pytest.approx(
            queued * each_kernel_s, abs=2 * each_kernel_s + 0.05 + 0.05 + counted_within
        )
        time.sleep(0.5)
        device = observer.sample(since_us=int(drained_at * 1e6) + 1)["devices"][0]
        assert device["utilization_ratio"] == 0.0
        assert device["process_samples"] == []  # nothing ran since
        assert me(observer.status())["used_memory_bytes"] > 2 * 2**30  # frozen, not gone
        train.unpause()
        wait_for(
            lambda: observer.sample()["devices"][0]["utilization_ratio"] > 0.5,
            timeout=5,
            interval=0.02,
        )
    train.kill()
    steps = [e["t"] for e in of(read_log(sim, "train"), "step")]
    # No step finished while it was frozen, except the queued ones draining.
    frozen = [t for t in steps if drained_at + 0.001 < t < drained_at + 0.5]
    assert frozen == []


def test_one_container_on_two_gpus(
    gpusim_daemon: Callable[..., GpusimService], run_python_container: Callable[..., Any]
) -> None:
    sim = gpusim_daemon(time_scale=SCALE, device=["name=g0,memory=8GiB", "name=g1,memory=8GiB"])
    args = ["train", "--devices", "0,1", "--steps", "60", "--step-work", "1.0"]
    both = run_python_container(workload(sim, "both", *args), extra_mounts=mounts(sim))
    pid = host_pid(both)
    with GpusimClient(sim.socket) as observer:
        held = [300 * 2**20 + 2 * 2**30] * 2  # its context and its 2 GiB, on each GPU

        def holds_both() -> bool:
            # the process shows on a GPU at its context, before its allocation lands
            devices = observer.sample()["devices"]
            alone = all([p["pid"] for p in d["processes"]] == [pid] for d in devices)
            return alone and [d["memory_used_bytes"] for d in devices] == held

        wait_for(holds_both, 20, "its context and 2 GiB on both GPUs, no other process", 0.02)
    assert exit_code(both) == 0
    events = read_log(sim, "both")
    assert all(e["devices"] == ["0", "1"] for e in events)
    summary = events[-1]
    # Each step ran on both GPUs at once: as fast as one GPU alone (50 ms a step).
    assert summary["steps"] == 60 and summary["steps_per_s"] == pytest.approx(20, rel=0.25)


def test_mig_instances_isolate_containers(
    gpusim_daemon: Callable[..., GpusimService], run_python_container: Callable[..., Any]
) -> None:
    sim = gpusim_daemon(
        time_scale=SCALE, device="name=a100,memory=80GiB,mig=3g.40gb+3g.30gb+1g.10gb"
    )
    work = ["--work-seconds", "6", "--memory-bytes", "3GiB"]  # 0.3 s on the whole GPU
    start_at = str(time.time() + 3.0)
    placed = {"a": "0:0", "b": "0:1", "c": "0:1"}
    containers = {
        name: run_python_container(
            workload(sim, name, *work, "--device", device, "--start-at", start_at),
            extra_mounts=mounts(sim),
        )
        for name, device in placed.items()
    }
    with GpusimClient(sim.socket) as observer:
        wait_for(lambda: len(observer.sample()["devices"][2]["processes"]) == 2, timeout=20)
        parent, inst0, inst1, inst2 = observer.sample()["devices"]
    assert (parent["mig_index"], inst0["mig_index"], inst2["mig_index"]) == (None, 0, 2)
    assert parent["processes"] == [] and inst2["processes"] == []
    assert {p["pid"] for p in inst1["processes"]} == {
        host_pid(containers["b"]),
        host_pid(containers["c"]),
    }
    assert inst0["memory_total_bytes"] == 40 * 2**30
    assert {d["utilization_ratio"] for d in (parent, inst0, inst1, inst2)} == {None}
    assert [exit_code(c) for c in containers.values()] == [0, 0, 0]
    seconds = {}
    for name in placed:
        seconds[name] = kernel_s({e["event"]: e for e in read_log(sim, name)})
    alone = 6 * 7 / 3 * SCALE  # a 3g instance has 3 of the GPU's 7 slices
    # a had its instance to itself; b and c shared theirs (paper B's overhead for 2).
    assert seconds["a"] == pytest.approx(alone, rel=0.1)
    assert seconds["b"] > 1.8 * alone and seconds["c"] > 1.8 * alone


def test_a_scenario_started_four_at_a_time_keeps_its_order_and_its_containers(
    gpusim_daemon: Callable[..., GpusimService], docker_client: Any, base_image: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    sim = gpusim_daemon(time_scale=SCALE)
    specs = [WorkloadSpec(f"conc-{i}", work_seconds=2.0, memory_bytes=30 * 2**20) for i in range(6)]
    scenario = Scenario("conc", docker_client, sim.dir, tmp_path, specs, start_delay=3.0)
    try:
        scenario.start(concurrently=4)
        scenario.wait(60)
        result = scenario.result()
    finally:
        scenario.remove()
    assert not result.errors
    assert [c.name for c in scenario_containers(docker_client, "conc")] == []
    # every workload ran its task, and each log was read for its own spec
    assert sorted(t.container for t in result.tasks) == [s.name for s in specs]

    # Two containers of one name: the engine refuses one; the other is kept, then removed.
    twins = [WorkloadSpec("twin", work_seconds=1.0, memory_bytes=30 * 2**20)] * 2
    scenario = Scenario("twins", docker_client, sim.dir, tmp_path, twins, start_delay=1.0)
    try:
        with pytest.raises(docker.errors.APIError) as refused:
            scenario.start(concurrently=4)
        assert refused.value.status_code == 409
        assert [c.name for c in scenario.containers] == ["twin"]
    finally:
        scenario.remove()
    assert scenario_containers(docker_client, "twins") == []


def scenario_containers(client: Any, scenario: str) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": f"{SCENARIO_LABEL}={scenario}"}))
