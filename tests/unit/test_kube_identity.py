"""A Kubernetes node: both kubelet cgroup drivers join, and the pod shows in state, metrics, ps.

Also the flags that choose the containerd source at the composition root.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuguard import kube, labels
from gpuguard.commands.ps import ps_rows
from gpuguard.demo.stack.reference_collector import GpuguardCollector
from gpuguard.exporter.cgroup import ProcReader
from gpuguard.exporter.collector import TextRenderer
from gpuguard.exporter.config import add_flags, load_config, pick_container_source
from gpuguard.exporter.errors import ConfigError
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.model import ContainerInfo
from gpuguard.exporter.poller import Poller
from gpuguard.exporter.state import state_json
from gpuguard.exporter.tracker import Tracker
from gpuguard.statedoc import parse_state
from tests.unit.exporter_fakes import GIB, FakeProcfs, ListBackend, StaticContainers, cid, sample
from tests.unit.exporter_fakes import container as make_container

UID = "5f3c2a1e-7d1b-4c7e-9a55-2e6e4f1b7c10"
CGROUP_FORMS = {
    "cgroupfs": f"/kubepods/burstable/pod{UID}/{cid(1)}",
    "systemd": (
        "/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{cid(1)}.scope"
    ),
}


def pod_container() -> ContainerInfo:
    return dataclasses.replace(
        make_container(1, "infer", deadline_s=2.0),
        pod_namespace="team-a",
        pod_name="web-0",
        pod_uid=UID,
    )


@pytest.mark.parametrize("driver", sorted(CGROUP_FORMS))
def test_pod_container_joins_and_shows_everywhere(tmp_path: Path, driver: str) -> None:
    procfs = FakeProcfs(tmp_path / "proc")
    procfs.add(100, cid(1), 500)
    (procfs.root / "100" / "cgroup").write_text(f"0::{CGROUP_FORMS[driver]}\n")
    backend = ListBackend()
    containers = StaticContainers(pod_container())
    events = EventLog(100)
    poller = Poller(
        backend, containers, ProcReader(procfs.root), Tracker(events), events, "node-a", 0.1
    )
    backend.next = sample(1.0, {100: GIB}, sm={100: 0.5})
    snap = poller.poll_once()
    assert snap.joined is not None and snap.joined.unattributed.get("0", 0) == 0

    registry = CollectorRegistry()
    registry.register(GpuguardCollector(lambda: poller.snapshot))
    # every per-container series names the pod, `container` being the pod spec's name
    pod = {"node": "node-a", "namespace": "team-a", "pod": "web-0", "container": "infer",
           "container_id": cid(1)[:12]}  # fmt: skip
    gpu0 = {"gpu": "0", "UUID": "GPU-00000000", "GPU_I_ID": ""}
    value = registry.get_sample_value
    assert value("gpuguard_container_gpu_memory_bytes", {**pod, **gpu0}) == GIB
    assert value("gpuguard_container_task_phase", {**pod, **gpu0, "phase": "computing"}) == 1
    assert value("gpuguard_container_deadline_seconds", pod) == 2.0
    assert value("gpuguard_container_tasks_finished_total", pod) == 0
    assert value("gpuguard_container_pod_info", {**pod, "pod_uid": UID}) == 1
    per_container = [s for m in registry.collect() for s in m.samples if "container_id" in s.labels]
    assert per_container and all(
        (s.labels["namespace"], s.labels["pod"]) == ("team-a", "web-0") for s in per_container
    )

    state = state_json(snap)
    (doc,) = state["containers"]
    assert (doc["namespace"], doc["pod"], doc["pod_uid"], doc["deadline_s"]) == (
        "team-a",
        "web-0",
        UID,
        2.0,
    )
    assert [row["NAME"] for row in ps_rows(parse_state(state))] == ["team-a/web-0/infer"]


def test_a_docker_container_has_no_pod(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path / "proc")
    containers = StaticContainers(make_container(1))
    events = EventLog(100)
    poller = Poller(
        ListBackend(), containers, ProcReader(procfs.root), Tracker(events), events, "n", 0.1
    )
    snap = poller.poll_once()
    state = state_json(snap)
    assert state["containers"][0]["pod"] is None
    assert ps_rows(parse_state(state))[0]["NAME"] == "rt-1"
    # the same label names, empty: Prometheus reads them as absent
    text = TextRenderer().render_snapshot(snap).decode()
    assert 'gpuguard_container_paused{node="n",namespace="",pod="",container="rt-1",' in text
    assert "gpuguard_container_pod_info{" not in text


def cri_labels(container: str, **extra: str) -> dict[str, str]:
    """A container's labels as containerd's CRI writes them: the kubelet's four, the kind,
    and whatever its image's config carries (``extra``)."""
    return {**extra, kube.POD_NAME: "chat", kube.POD_NAMESPACE: "team-a", kube.POD_UID: UID,
            kube.CONTAINER_NAME: container, kube.KIND: "container"}  # fmt: skip


POD = {
    kube.KIND: kube.KIND_SANDBOX, kube.POD_NAME: "chat", kube.POD_NAMESPACE: "team-a",
    kube.POD_UID: UID, "app": "chat", labels.CLASS: "real-time", labels.DEADLINE: "2s",
    labels.SLO_METRIC: "vllm_e2e_request_latency_seconds", labels.SLO_TARGET: "500ms",
}  # fmt: skip
CLAIMS = {key: value for key, value in POD.items() if key.startswith("gpuguard.")}


def test_a_pods_gpuguard_labels_reach_each_of_its_containers() -> None:
    merged = kube.effective_labels(cri_labels("infer"), POD)
    assert merged == {**cri_labels("infer"), **CLAIMS}  # not the pod's `app`, nor its kind


def test_a_pod_names_the_one_container_its_claims_are_for() -> None:
    pod = {**POD, labels.CONTAINER: "vllm"}
    assert kube.effective_labels(cri_labels("vllm"), pod) == {**cri_labels("vllm"), **CLAIMS}
    # the sidecar inherits no class, deadline or SLO, and the scope itself reaches no one
    assert kube.effective_labels(cri_labels("log-shipper"), pod) == cri_labels("log-shipper")
    # a name no container has: the claims reach none (not all)
    typo = {**POD, labels.CONTAINER: "vlm"}
    assert kube.effective_labels(cri_labels("vllm"), typo) == cri_labels("vllm")


def test_a_cri_containers_own_gpuguard_labels_came_from_its_image_and_are_ignored() -> None:
    """containerd's CRI puts the image config's labels beneath the kubelet's four: a
    gpuguard.* label there is the image builder's claim, never the pod spec's."""
    title = {"org.opencontainers.image.title": "t"}
    image = {labels.CLASS: "real-time", labels.ROLE: "exporter", labels.DEADLINE: "1ms",
             labels.MANAGED: "false", labels.CONTAINER: "x", **title}  # fmt: skip
    own = cri_labels("vllm", **image)
    merged = kube.effective_labels(own, {**POD, labels.MANAGED: "true"})
    assert merged == {**cri_labels("vllm", **title), **CLAIMS, labels.MANAGED: "true"}
    # without a pod label of its own, the image's claim is not believed either
    assert kube.effective_labels(own, None) == cri_labels("vllm", **title)


def test_a_container_the_cri_did_not_make_keeps_its_own_labels() -> None:
    own = {labels.DEADLINE: "1s", kube.POD_UID: "u"}  # no pod name: not the CRI's
    assert kube.pod_identity(own) is None
    assert kube.effective_labels(own, POD) == own


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args(list(argv))


def test_containerd_flags() -> None:
    config = load_config(parse(), env={})
    assert (config.container_source, config.containerd_namespace) == ("docker", "k8s.io")
    assert config.containerd_address == "unix:///run/containerd/containerd.sock"
    config = load_config(
        parse("--container.source", "containerd", "--containerd.address", "/x/c.sock",
              "--containerd.namespace", "default"),
        env={},
    )  # fmt: skip
    assert (config.container_source, config.containerd_address) == ("containerd", "/x/c.sock")
    assert pick_container_source(config) == "containerd"
    with pytest.raises(ConfigError, match=r"--container\.source"):
        load_config(parse("--container.source", "cri-o"), env={})
    with pytest.raises(ConfigError, match=r"--containerd\.address"):
        load_config(parse("--containerd.address", "tcp://x:1"), env={})


def test_auto_prefers_docker_then_containerd(tmp_path: Path) -> None:
    docker, containerd = tmp_path / "docker.sock", tmp_path / "containerd.sock"
    argv = ("--container.source", "auto", "--docker.host", f"unix://{docker}",
            "--containerd.address", f"unix://{containerd}")  # fmt: skip
    assert pick_container_source(load_config(parse(*argv), env={})) == "docker"
    containerd.touch()
    assert pick_container_source(load_config(parse(*argv), env={})) == "containerd"
    docker.touch()
    assert pick_container_source(load_config(parse(*argv), env={})) == "docker"


def test_the_containerd_source_without_ctr_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from gpuguard.exporter import app

    monkeypatch.setattr(app.shutil, "which", lambda name: None)
    config = load_config(
        parse("--container.source", "containerd", "--gpu.backend", "gpusim",
              "--gpusim.socket", str(tmp_path / "none.sock")),
        env={},
    )  # fmt: skip
    assert app.run_exporter(config) == 1
    assert (
        capsys.readouterr().err.strip().endswith("needs ctr on PATH (Debian's containerd package)")
    )
