"""The exporter on a Kubernetes-like node: a real private containerd, pods made the way the
kubelet makes them (``containerd_support``), gpusim workloads in them.

Attribution through both kubelet cgroup drivers' paths, the pod's identity and its labels
(deadline, managed) read from the sandbox, in /api/v1/state and /metrics, and never the
gpuguard.* labels an image's config brings; pause, resume and removal followed from
containerd's events.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from containerd_support import Pod, import_image
from exporter_support import ExporterProcess, sample_value, workload_args, workload_log
from prometheus_client.parser import text_string_to_metric_families

from gpuguard.demo.stack.containerd import PrivateContainerd
from gpuguard.demo.stack.gpusim import GpusimService
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def container_doc(state: dict[str, Any], container_id: str) -> dict[str, Any] | None:
    return next((c for c in state["containers"] if c["id"] == container_id), None)


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
def test_pod_tasks_attributed_with_pod_identity_and_pod_labels(
    k8s_exporter: ExporterProcess,
    sim: GpusimService,
    pods: Callable[..., Pod],
    driver: str,
) -> None:
    pod = pods(f"web-{driver}", driver, {"gpuguard.deadline": "5s", "gpuguard.managed": "true",
                                         "app": "web"})  # fmt: skip
    log_name = f"infer-{driver}.log"
    args = workload_args(sim, log_name, "--work-seconds", "10", "--memory-bytes", "30MiB",
                         "--repeat", "2", "--sleep-between", "0.4")  # fmt: skip
    cid = pod.run_python("infer", args, [str(sim.dir)])
    ident = {"namespace": "team-a", "pod": pod.name, "container": "infer",
             "container_id": cid[:12]}  # fmt: skip
    # while it runs: the per-container-and-GPU series name the pod too
    wait_for(
        lambda: k8s_exporter.metric("gpuguard_container_gpu_memory_bytes", **ident),
        timeout=60,
        what="the pod's GPU memory series",
        interval=0.05,
    )
    wait_for(
        lambda: len([t for t in k8s_exporter.state()["recent"] if t["container_id"] == cid]) == 2,
        timeout=60,
        what="both runs finished and attributed to the pod's container",
        interval=0.05,
    )
    state = k8s_exporter.state()
    tasks = sorted(
        (t for t in state["recent"] if t["container_id"] == cid), key=lambda t: t["started_at"]
    )
    starts = [e["t"] for e in workload_log(sim, log_name) if e["event"] == "task_start"]
    for task, start in zip(tasks, starts, strict=True):
        assert task["container"] == "infer"
        assert task["started_at"] == pytest.approx(start, abs=0.3)
        assert task["deadline_s"] == 5.0 and task["met_deadline"] is True  # the pod's label
    doc = container_doc(state, cid)
    assert doc is not None
    assert (doc["name"], doc["namespace"], doc["pod"], doc["pod_uid"]) == (
        "infer", "team-a", pod.name, pod.uid,
    )  # fmt: skip
    assert doc["deadline_s"] == 5.0 and doc["managed"] is True
    assert container_doc(state, pod.sandbox_id) is None  # the sandbox is no workload

    text = k8s_exporter.metrics_text()
    assert sample_value(text, "gpuguard_container_pod_info", **ident, pod_uid=pod.uid) == 1
    assert sample_value(text, "gpuguard_container_deadline_seconds", **ident) == 5.0
    assert sample_value(text, "gpuguard_container_managed", **ident) == 1
    assert sample_value(text, "gpuguard_container_tasks_finished_total", **ident) == 2
    assert sample_value(text, "gpuguard_container_deadline_hits_total", **ident) == 2
    # every series of the container, whatever its family, names the pod
    labels = [
        s.labels
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("container_id") == cid[:12]
    ]
    assert len(labels) >= 10
    assert all({k: v for k, v in ls.items() if k in ident} == ident for ls in labels), labels


def test_gpuguard_labels_from_the_image_are_not_believed(
    k8s_exporter: ExporterProcess, pods: Callable[..., Pod], containerd: PrivateContainerd
) -> None:
    """containerd merges an image config's labels into its container's, beneath the caller's
    (the CRI's buildLabels; ctr's client the same way, as here): an image can carry
    gpuguard.* claims that no pod spec made. Only the pod's (its sandbox's) count."""
    claims = {"gpuguard.class": "real-time", "gpuguard.role": "exporter",
              "gpuguard.deadline": "1ms", "gpuguard.managed": "false",
              "gpuguard.slo.metric": "vllm_e2e_request_latency_seconds",
              "gpuguard.slo.target": "500ms", "gpuguard.container": "app"}  # fmt: skip
    image = import_image(containerd, "docker.io/tenant/claims:1", claims)
    pod = pods("claims", "cgroupfs", {"gpuguard.class": "best-effort",
                                      "gpuguard.managed": "true"})  # fmt: skip
    cid = pod.run_command("app", ["/bin/sleep", "3600"], image=image)
    # the claims did reach the container's labels, under the kubelet's four
    own = json.loads(containerd.check("containers", "info", cid))["Labels"]
    assert {k: own[k] for k in claims} == claims
    assert own["io.kubernetes.container.name"] == "app"

    doc = wait_for(lambda: container_doc(k8s_exporter.state(), cid), 10, "the image's container")
    assert (doc["class"], doc["managed"], doc["role"]) == ("best-effort", True, None)
    assert (doc["deadline_s"], doc["slo"], doc["claims_rejected"]) == (None, None, [])
    text = k8s_exporter.metrics_text()
    ident = {"namespace": "team-a", "pod": pod.name, "container": "app"}
    assert sample_value(text, "gpuguard_container_managed", **ident) == 1
    assert sample_value(text, "gpuguard_container_deadline_seconds", **ident) is None
    assert sample_value(text, "gpuguard_container_slo_info", **ident) is None


def test_pause_resume_and_removal_followed_from_events(
    k8s_exporter: ExporterProcess, pods: Callable[..., Pod], containerd: PrivateContainerd
) -> None:
    pod = pods("sleepy", "cgroupfs", {"gpuguard.task": "process"})
    cid = pod.run_sleeper("idle")

    def state_of() -> dict[str, Any] | None:
        return container_doc(k8s_exporter.state(), cid)

    wait_for(lambda: (state_of() or {}).get("state") == "running", timeout=10, what="running")
    assert (state_of() or {})["task_mode"] == "process"  # from the pod's label
    containerd.check("tasks", "pause", cid)
    wait_for(lambda: (state_of() or {}).get("paused") is True, timeout=10, what="paused")
    containerd.check("tasks", "resume", cid)
    wait_for(lambda: (state_of() or {}).get("paused") is False, timeout=10, what="resumed")
    containerd.remove(cid)
    wait_for(lambda: state_of() is None, timeout=10, what="removed")
    types = [e["type"] for e in k8s_exporter.events()["events"] if e.get("container_id") == cid]
    assert types == ["container_started", "container_paused", "container_resumed",
                     "container_removed"]  # fmt: skip


def test_a_restarted_containerd_is_resynced_and_followed_again(
    k8s_exporter: ExporterProcess, pods: Callable[..., Pod], containerd: PrivateContainerd
) -> None:
    pod = pods("restart", "systemd", {})
    before = pod.run_sleeper("before")
    wait_for(lambda: container_doc(k8s_exporter.state(), before), 10, "first container seen")
    # the source's health names the engine it follows, not Docker
    assert k8s_exporter.metric("gpuguard_exporter_collector_success", source="containerd") == 1
    assert k8s_exporter.metric("gpuguard_exporter_collector_success", source="docker") is None
    assert k8s_exporter.state()["sources"] == {"gpu": True, "containerd": True, "procfs": True}
    errors = k8s_exporter.metric("gpuguard_exporter_errors_total", source="containerd") or 0

    containerd.restart_daemon()
    after = pod.run_sleeper("after")

    wait_for(lambda: container_doc(k8s_exporter.state(), after), 20, "container made after")
    assert (container_doc(k8s_exporter.state(), before) or {}).get("state") == "running"
    assert k8s_exporter.metric("gpuguard_exporter_collector_success", source="containerd") == 1
    restarted = k8s_exporter.metric("gpuguard_exporter_errors_total", source="containerd")
    assert restarted is not None and restarted > errors
    containerd.remove(before)  # followed again after the restart
    wait_for(lambda: container_doc(k8s_exporter.state(), before) is None, 10, "removal seen")
