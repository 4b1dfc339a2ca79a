"""Admission end to end on a Kubernetes-like node, no Docker anywhere: the exporter follows a
real private containerd, the actuator's fast path freezes pods' containers through their
cgroups and hands them to containerd, a guard watches; gpusim workloads in pods made as the
kubelet makes them (``containerd_support``) say when each kernel ran.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from containerd_support import Pod, exited
from exporter_support import ExporterProcess, workload_args
from test_actuator_live import ActuatorProcess, GuardProcess, arrival_order, kernel_intervals

from gpuguard.demo.stack.containerd import PrivateContainerd
from gpuguard.demo.stack.gpusim import GpusimService

pytestmark = pytest.mark.integration

SCALE = 0.1  # gpusim kernel time scale: a 13,312 matmul kernel lasts ~1.1 s


@pytest.fixture
def sim_time_scale() -> float:
    return SCALE


@pytest.fixture
def admission(
    containerd: PrivateContainerd, sim: GpusimService, tmp_path: Path
) -> Iterator[ActuatorProcess]:
    """Exporter, guard and actuator (fast path), all on containerd; Docker's URL leads nowhere."""
    no_docker = f"unix://{tmp_path}/no-docker.sock"
    on_containerd = f"--containerd.address={containerd.address}"
    exporter = ExporterProcess(tmp_path, no_docker, sim.socket, "--poll.interval=20ms",
                               "--container.source=containerd", on_containerd).start()  # fmt: skip
    state_dir = tmp_path / "actuator"
    guard = GuardProcess(state_dir, no_docker, on_containerd)
    actuator = ActuatorProcess(state_dir, exporter.url, no_docker, "--mode=fast", on_containerd)
    try:
        yield actuator.start()
    finally:
        actuator.stop()  # first: on SIGTERM it resumes what it paused
        guard.stop()
        exporter.stop()


def test_pods_are_admitted_one_at_a_time_in_fifo_order(
    containerd: PrivateContainerd,
    sim: GpusimService,
    pods: Callable[..., Pod],
    admission: ActuatorProcess,
) -> None:
    start_at = time.time() + 3.0
    names = [f"fifo-{i}" for i in range(3)]
    ids = {}
    for i, name in enumerate(names):
        driver = "systemd" if i % 2 else "cgroupfs"
        pod = pods(name, driver, {"gpuguard.managed": "true", "gpuguard.deadline": "60s"})
        # 6 GiB (~0.57 s of input): the window in which a waiting task must be frozen
        args = workload_args(sim, f"{name}.log", "--size", "13312", "--memory-bytes", "6GiB",
                             "--start-at", f"{start_at + 0.15 * i:.3f}")  # fmt: skip
        ids[name] = pod.run_python("infer", args, [str(sim.dir)])
    deadline = time.monotonic() + 60
    while not all(exited(containerd, cid) for cid in ids.values()):
        assert time.monotonic() < deadline, admission.log_tail()
        time.sleep(0.1)

    kernels = kernel_intervals(sim, names)
    assert all(len(k) == 1 for k in kernels.values()), kernels
    ordered = sorted((k[0], name) for name, k in kernels.items())
    assert [name for _, name in ordered] == arrival_order(sim, names), f"not FIFO: {ordered}"
    for (a, _), (b, _) in itertools.pairwise(ordered):
        assert b[0] >= a[1] - 1e-3, f"two managed kernels overlapped: {a} {b}"
    audit = admission.audit()
    pauses = [
        r
        for r in audit
        if (r["event"], r.get("action"), r.get("result")) == ("action", "pause", "ok")
    ]
    assert {ids[n] for n in names[1:]} <= {r["container_id"] for r in pauses}
    assert all(r["method"] == "cgroup" for r in pauses)
    told = [r for r in audit if r["event"] == "runtime_pause"]  # containerd's task pause
    assert told and all(r["result"] in ("ok", "cancelled", "skipped") for r in told), told
    assert all(r["engine"] == "containerd" for r in told), told
