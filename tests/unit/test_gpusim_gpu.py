"""The simulated GPU driven directly with explicit times: streams, queues, MIG, two devices."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuguard.gpusim.config import DaemonConfig, DeviceSpec, parse_device_spec
from gpuguard.gpusim.contention import COPY_IN_BYTES_PER_S, matmul_flops
from gpuguard.gpusim.errors import GpusimError
from gpuguard.gpusim.gpu import SimulatedGpu
from gpuguard.gpusim.protocol import parse_request
from gpuguard.slowdown import slowdown_factor

GIB = 2**30
MIB = 2**20
WALL = 1_000.0  # wall clock = monotonic + WALL
PERIOD = 0.1


class Harness:
    """One SimulatedGpu, requests as protocol lines, replies collected per connection."""

    def __init__(self, config: DaemonConfig) -> None:
        self.gpu = SimulatedGpu(config, 0.0, lambda: WALL)
        self.replies: dict[int, list[tuple[float, dict[str, Any]]]] = {}

    def send(self, conn: int, t: float, op: str, pid: int = 100, **args: Any) -> Any:
        """The immediate reply, or None when it will come later."""
        line = json.dumps({"op": op, **args}).encode()
        self.run(t)
        return self.gpu.handle(conn, pid, parse_request(line), t)

    def run(self, t: float) -> None:
        """Advance to ``t`` event by event, timestamping each late reply when it is made."""
        while (wake := self.gpu.next_wakeup()) is not None and wake <= t:
            self.gpu.advance(wake)
            self._collect(wake)
        self.gpu.advance(t)
        self._collect(t)

    def _collect(self, t: float) -> None:
        for conn, reply in self.gpu.pop_completions():
            self.replies.setdefault(conn, []).append((t, reply))

    def late(self, conn: int) -> list[tuple[float, dict[str, Any]]]:
        return self.replies.get(conn, [])

    def device(self, t: float, address: str = "0") -> dict[str, Any]:
        """The ``status`` entry of one device at ``t``."""
        self.run(t)
        for dev in self.gpu.status(t)["devices"]:
            if dev["address"] == address:
                return dev
        raise KeyError(address)


def config(*devices: DeviceSpec, depth: int = 1024) -> DaemonConfig:
    return DaemonConfig(
        devices=devices or (DeviceSpec(0, "a", 24 * GIB), DeviceSpec(1, "b", 24 * GIB)),
        context_memory_bytes=300 * MIB,
        sample_period_s=PERIOD,
        launch_queue_depth=depth,
    )


@pytest.fixture
def sim() -> Harness:
    return Harness(config())


def test_launches_return_at_once_and_run_in_order(sim: Harness) -> None:
    sim.send(1, 0.0, "context_create", device=0)
    for n in (1, 2, 3):
        assert sim.send(1, 0.0, "launch", work=1.0) == {"ok": True, "queued": n}
    event = sim.send(1, 0.0, "event_record")
    assert event == {"ok": True, "queued": 4, "event": 1}
    proc = sim.device(0.5)["processes"][0]
    assert (proc["phase"], proc["kernels_running"], proc["kernels_queued"]) == ("kernel", 1, 3)
    assert sim.send(1, 0.5, "synchronize") is None  # waits for the stream to drain
    sim.run(2.9)
    assert sim.late(1) == []
    sim.run(10.0)
    # One stream: the kernels ran one after another, with no gap and no time-slicing.
    ((t, reply),) = sim.late(1)
    assert t == pytest.approx(3.0)
    assert reply == {"ok": True, "events": [{"id": 1, "t": pytest.approx(WALL + 3.0)}]}
    assert sim.send(1, 10.0, "synchronize") == {"ok": True, "events": []}  # idle: at once


def test_a_full_launch_queue_blocks_the_launch_until_a_slot_frees() -> None:
    sim = Harness(config(depth=2))
    sim.send(1, 0.0, "context_create", device=0)
    assert sim.send(1, 0.0, "launch", work=1.0)["queued"] == 1
    assert sim.send(1, 0.0, "launch", work=1.0)["queued"] == 2
    assert sim.send(1, 0.0, "launch", work=1.0) is None  # cudaLaunchKernel would block
    sim.run(0.99)
    assert sim.late(1) == []
    sim.run(1.5)
    assert sim.late(1) == [(pytest.approx(1.0), {"ok": True, "queued": 2})]
    assert sim.device(1.5)["processes"][0]["kernels_queued"] == 2


def test_a_frozen_process_stops_launching_and_its_queue_drains(sim: Harness) -> None:
    # A training loop launched 4 kernels, then was frozen: it sends nothing more.
    sim.send(1, 0.0, "context_create", device=0, pid=7)
    for _ in range(4):
        sim.send(1, 0.0, "launch", work=0.5, pid=7)
    assert sim.device(1.9)["utilization_ratio"] == 1.0
    assert sim.device(1.9)["processes"][0]["kernels_queued"] == 1
    drained = sim.device(2.0 + PERIOD)
    assert drained["utilization_ratio"] == pytest.approx(0.0, abs=1e-9)
    assert drained["processes"][0]["kernels_queued"] == 0
    # The context and its memory stay: the process is frozen, not gone.
    assert drained["processes"][0]["used_memory_bytes"] == 300 * MIB
    samples = sim.gpu.sample(2.0 + PERIOD, 0)["devices"][0]["process_samples"]
    # the driver's instant that closed the period in which it last ran
    assert samples[-1]["timestamp_us"] == int((WALL + 2.0) * 1e6)


def test_process_samples_come_at_the_drivers_instants_not_when_asked(sim: Harness) -> None:
    # NVML: one sample per active process per sample period, at the driver's own instants;
    # a query between two instants gets nothing new, although the kernel still runs.
    def samples(t: float, since_us: int) -> list[tuple[float, float]]:
        sim.run(t)
        found = sim.gpu.sample(t, since_us)["devices"][0]["process_samples"]
        return [(round(s["timestamp_us"] / 1e6 - WALL, 6), s["sm_ratio"]) for s in found]

    sim.send(1, 0.0, "context_create", device=0, pid=7)
    sim.send(1, 0.0, "launch", work=10.0, pid=7)
    first = samples(0.55, 0)
    assert first == [(t, pytest.approx(1.0)) for t in (0.1, 0.2, 0.3, 0.4, 0.5)]
    since = int((WALL + 0.5) * 1e6)
    assert samples(0.58, since) == []
    assert samples(0.61, since) == [(0.6, pytest.approx(1.0))]
    # A kernel that ends half-way through a period has half of it; nothing after that.
    sim.send(2, 10.0, "context_create", device=0, pid=8)
    sim.send(2, 10.0, "launch", work=0.25, pid=8)
    assert samples(10.5, int((WALL + 10.0) * 1e6)) == [
        (10.1, pytest.approx(1.0)),
        (10.2, pytest.approx(1.0)),
        (10.3, pytest.approx(0.5)),
    ]


def test_queued_kernels_time_slice_with_another_process(sim: Harness) -> None:
    sim.send(1, 0.0, "context_create", device=0, pid=7)
    sim.send(2, 0.0, "context_create", device=0, pid=8)
    for _ in range(2):
        sim.send(1, 0.0, "launch", work=1.0, pid=7)
    assert sim.send(2, 0.0, "kernel", work=1.0, pid=8) is None
    sim.run(20.0)
    ((t, reply),) = sim.late(2)
    # Two contexts share the device, each at 1 / (2 f2) of its speed.
    assert reply["ended"] - reply["started"] == pytest.approx(2 * slowdown_factor(2))
    assert t == pytest.approx(2 * slowdown_factor(2))


def test_copies_are_synchronous_and_wait_for_launched_kernels(sim: Harness) -> None:
    sim.send(1, 0.0, "context_create", device=0)
    sim.send(1, 0.0, "launch", work=2.0)
    assert sim.send(1, 0.0, "copy_out", bytes=int(COPY_IN_BYTES_PER_S)) is None
    sim.run(10.0)
    ((t, reply),) = sim.late(1)
    assert t == pytest.approx(2.0 + COPY_IN_BYTES_PER_S / 2.2e9)
    assert reply["seconds"] == pytest.approx(COPY_IN_BYTES_PER_S / 2.2e9)


def test_a_synchronous_kernel_waits_behind_launched_ones(sim: Harness) -> None:
    sim.send(1, 0.0, "context_create", device=0)
    sim.send(1, 0.0, "launch", work=1.0)
    assert sim.send(1, 0.0, "kernel", flops=matmul_flops(13312) / 10.795) is None  # 1 s
    sim.run(5.0)
    ((_, reply),) = sim.late(1)
    assert (reply["started"], reply["ended"]) == (pytest.approx(WALL + 1), pytest.approx(WALL + 2))


def test_exit_drops_queued_kernels_at_once(sim: Harness) -> None:
    sim.send(1, 0.0, "context_create", device=0)
    sim.send(1, 0.0, "alloc", bytes=GIB)
    for _ in range(10):
        sim.send(1, 0.0, "launch", work=1.0)
    sim.run(1.5)
    sim.gpu.disconnect(1, 1.5)
    dev = sim.device(1.5 + PERIOD)
    assert (dev["processes"], dev["memory_used_bytes"]) == ([], 0)
    assert dev["utilization_ratio"] == pytest.approx(0.0, abs=1e-9)
    assert sim.gpu.next_wakeup() is None


def test_one_process_on_two_devices(sim: Harness) -> None:
    # One host PID, one connection (context) per device: each device lists it once.
    sim.send(1, 0.0, "context_create", device=0, pid=42)
    sim.send(2, 0.0, "context_create", device="1", pid=42)
    sim.send(2, 0.0, "alloc", bytes=GIB, pid=42)
    sim.send(1, 0.0, "kernel", work=1.0, pid=42)
    sim.send(2, 0.0, "kernel", work=1.0, pid=42)
    sim.run(5.0)
    # Separate engines: neither kernel slowed the other.
    for conn in (1, 2):
        ((t, _),) = sim.late(conn)
        assert t == pytest.approx(1.0)
    procs = {d["address"]: d["processes"] for d in sim.gpu.status(5.0)["devices"]}
    assert [p["pid"] for p in procs["0"]] == [p["pid"] for p in procs["1"]] == [42]
    assert procs["1"][0]["used_memory_bytes"] == 300 * MIB + GIB
    assert procs["0"][0]["used_memory_bytes"] == 300 * MIB


@pytest.fixture
def mig() -> Harness:
    spec = parse_device_spec("name=a100,memory=80GiB,mig=3g.40gb+3g.30gb+1g.10gb", 0)
    return Harness(config(spec, DeviceSpec(1, "plain", 24 * GIB)))


def test_mig_instances_are_separate_engines(mig: Harness) -> None:
    for conn, address in ((1, "0:0"), (2, "0:1"), (3, "0:1")):
        mig.send(conn, 0.0, "context_create", device=address, pid=conn)
        mig.send(conn, 0.0, "kernel", work=3.0, pid=conn)
    mig.run(60.0)
    # A 3g instance has 3 of 7 slices: 3 device-seconds take 7 s alone...
    assert mig.late(1)[0][0] == pytest.approx(7.0)
    # ...and the two kernels on 0:1 share that instance, not 0:0.
    assert mig.late(2)[0][0] == pytest.approx(14.0 * slowdown_factor(2))
    assert mig.late(3)[0][0] == pytest.approx(14.0 * slowdown_factor(2))


def test_mig_memory_and_nvml_reporting(mig: Harness) -> None:
    mig.send(1, 0.0, "context_create", device="0:2", pid=5)
    with pytest.raises(GpusimError) as err:  # 10 GiB instance, 79 GiB free on the GPU
        mig.send(1, 0.0, "alloc", bytes=10 * GIB, pid=5)
    assert err.value.code == "out_of_memory"
    mig.send(1, 0.0, "alloc", bytes=GIB, pid=5)
    mig.send(1, 0.0, "launch", work=100.0, pid=5)
    mig.send(2, 0.0, "context_create", device=1, pid=6)
    sample = mig.gpu.sample(1.0, 0)["devices"]
    keys = [(d["index"], d["mig_index"]) for d in sample]
    assert keys == [(0, None), (0, 0), (0, 1), (0, 2), (1, None)]
    parent, inst = sample[0], sample[3]
    assert parent["memory_total_bytes"] == 80 * GIB
    assert parent["memory_used_bytes"] == inst["memory_used_bytes"] == 300 * MIB + GIB
    assert parent["processes"] == []
    assert inst["memory_total_bytes"] == 10 * GIB
    assert inst["processes"] == [{"pid": 5, "used_memory_bytes": 300 * MIB + GIB}]
    assert inst["name"] == "a100 MIG 1g.10gb" and inst["uuid"].startswith("MIG-")
    # NVML gives no utilization and no per-process samples on a MIG-enabled GPU.
    assert {d["utilization_ratio"] for d in sample[:4]} == {None}
    assert all(d["process_samples"] == [] for d in sample[:4])
    # gpusim's own status still says the instance is busy.
    assert mig.device(1.0, "0:2")["engine_utilization_ratio"] == 1.0


def test_mig_addressing(mig: Harness) -> None:
    spec = mig.gpu.config.devices[0]
    with pytest.raises(GpusimError, match=r"MIG mode.*0:0, 0:1, 0:2"):
        mig.send(1, 0.0, "context_create", device="0")
    with pytest.raises(GpusimError, match="MIG mode"):
        mig.send(1, 0.0, "context_create", device=spec.uuid)
    with pytest.raises(GpusimError, match="no device 0:3"):
        mig.send(1, 0.0, "context_create", device="0:3")
    reply = mig.send(1, 0.0, "context_create", device=spec.mig_uuid(1))
    assert (reply["device"], reply["uuid"]) == ("0:1", spec.mig_uuid(1))
    assert mig.send(2, 0.0, "context_create", device="00:02")["device"] == "0:2"


def test_mig_specs_must_fit_the_gpu() -> None:
    for bad in ("memory=80GiB,mig=4g.40gb+4g.40gb", "memory=40GiB,mig=3g.40gb+1g.10gb"):
        with pytest.raises(ValueError):
            parse_device_spec(bad, 0)
    with pytest.raises(ValueError, match="invalid MIG profile"):
        parse_device_spec("mig=8g.80gb", 0)


def test_unreported_events_are_bounded(sim: Harness) -> None:
    sim.send(1, 0.0, "context_create", device=0)
    for _ in range(5000):
        sim.send(1, 0.0, "event_record")
    events = sim.send(1, 0.0, "synchronize")["events"]
    assert len(events) == 4096 and events[-1]["id"] == 5000
