"""GPU sharing as the NVIDIA device plugin's time-slicing gives it to pods, on a real private
containerd: two pods each granted a replica of the same GPU carry that GPU's UUID in
``NVIDIA_VISIBLE_DEVICES`` (the plugin strips the replica suffix: ``GPU-<uuid>::1`` is the
replica's device id, ``GPU-<uuid>`` what the container gets), so their tasks land on one
device and wait in gpuguard's one queue for it; a pod on the node's other GPU is in another
queue and runs beside them.

No kubelet or device plugin can run here: the pods are made as the kubelet makes them
(``containerd_support``: CRI labels, a sandbox, kubelet cgroups) with the environment the
plugin's Allocate answer adds. gpusim's devices carry fixed UUIDs, and each workload opens
its device by that UUID, as CUDA's device 0 in such a container is the GPU the UUID names.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import requests
from containerd_support import Pod, exited
from exporter_support import workload_args
from test_actuator_live import ActuatorProcess, kernel_intervals
from test_containerd_fastpath import SCALE, admission

from gpuguard.demo.stack.containerd import PrivateContainerd
from gpuguard.demo.stack.gpusim import GpusimService
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
__all__ = ["admission"]  # fixture: exporter, guard and actuator (fast path) on containerd

UUID_0 = "GPU-5b1e7f3a-0c4d-4e8a-9f21-000000000000"
UUID_1 = "GPU-5b1e7f3a-0c4d-4e8a-9f21-000000000001"
TWO_GPUS = {
    "device": [f"name=g0,memory=24GiB,uuid={UUID_0}", f"name=g1,memory=24GiB,uuid={UUID_1}"]
}
REAL_TIME = {"gpuguard.managed": "true", "gpuguard.deadline": "60s"}


@pytest.fixture
def sim_time_scale() -> float:
    return SCALE


def exporter_state(actuator: ActuatorProcess) -> dict[str, Any]:
    url = next(a.split("=", 1)[1] for a in actuator.argv if a.startswith("--exporter.url="))
    state: dict[str, Any] = requests.get(url + "/api/v1/state", timeout=5).json()
    return state


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.parametrize("sim_options", [TWO_GPUS])
def test_pods_sharing_one_gpu_by_uuid_are_queued_against_each_other(
    containerd: PrivateContainerd,
    sim: GpusimService,
    pods: Callable[..., Pod],
    admission: ActuatorProcess,
) -> None:
    start_at = time.time() + 4.0
    # (pod, the GPU the device plugin granted it, when its task starts)
    plan = [("share-a", UUID_1, 0.0), ("share-b", UUID_1, 0.15), ("alone", UUID_0, 0.3)]
    ids = {}
    for i, (name, uuid, delay) in enumerate(plan):
        pod = pods(name, "systemd" if i % 2 else "cgroupfs", REAL_TIME)
        # 6 GiB (~0.57 s of input): the window in which a waiting task must be frozen
        args = workload_args(sim, f"{name}.log", "--size", "13312", "--device", uuid,
                             "--memory-bytes", "6GiB", "--start-at",
                             f"{start_at + delay:.3f}")  # fmt: skip
        env = {"NVIDIA_VISIBLE_DEVICES": uuid}
        ids[name] = pod.run_python("infer", args, [str(sim.dir)], env=env)

    # the exporter reads each container's GPUs from its OCI spec, as the device plugin set them
    def gpus_seen() -> dict[str, list[str]]:
        found = {c["id"]: c["gpus"] for c in exporter_state(admission)["containers"]}
        return {name: found.get(cid, []) for name, cid in ids.items()}

    wait_for(lambda: all(gpus_seen().values()), 15, "the pods' GPUs in the exporter's state")
    assert gpus_seen() == {"share-a": [UUID_1], "share-b": [UUID_1], "alone": [UUID_0]}

    deadline = time.monotonic() + 60
    while not all(exited(containerd, cid) for cid in ids.values()):
        assert time.monotonic() < deadline, admission.log_tail()
        time.sleep(0.1)
    kernels = kernel_intervals(sim, [name for name, _, _ in plan])
    assert all(len(k) == 1 for k in kernels.values()), kernels
    (a,), (b,), (alone,) = kernels["share-a"], kernels["share-b"], kernels["alone"]
    # one queue for the shared GPU: first come, first served, never both at once
    assert b[0] >= a[1] - 1e-3, f"two pods' kernels on the shared GPU overlapped: {a} {b}"
    # the other GPU's queue is its own: its pod ran while the shared GPU was busy
    assert overlap(alone, a) or overlap(alone, b), f"GPU 0 waited for GPU 1: {alone} {a} {b}"
    pauses = [
        r
        for r in admission.audit()
        if (r["event"], r.get("action"), r.get("result")) == ("action", "pause", "ok")
    ]
    paused = {r["container_id"]: r["gpu"] for r in pauses}
    assert paused.get(ids["share-b"]) == 1, pauses  # queued on the shared GPU's device
    assert ids["alone"] not in paused and ids["share-a"] not in paused
