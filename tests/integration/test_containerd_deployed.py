"""The exporter's image as deploy/kubernetes/exporter.yaml runs it, on a Kubernetes-like node.

The container is made from the DaemonSet itself: its args (the containerd source, socket
and namespace), its user and supplementary groups (uid 10001 in group 0, the group of
containerd's root-only socket), read-only root, no capabilities, the host's PIDs and /proc,
and the socket mounted where the manifest mounts it. It must follow a real private
containerd through the image's own ``ctr``, join a pod's GPU process through the host's
/proc, and name the pod on its series. The image is ``gpuguard/gpuguard:local``
(``gpuguard.demo.stack.appimage``: deploy/Dockerfile's stand-in where nothing can be pulled,
with the host's ``ctr`` where the Dockerfile copies Debian's).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from containerd_support import Pod
from exporter_support import sample_value, workload_args

from gpuguard.demo.stack.appimage import ensure_app_image
from gpuguard.demo.stack.containerd import PrivateContainerd
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.process import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "exporter.yaml"


def exporter_daemonset() -> dict[str, Any]:
    (daemonset,) = [
        d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "DaemonSet"
    ]
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def manifest_args(main: dict[str, Any], port: int, sim: GpusimService) -> list[str]:
    """The DaemonSet's args, with this test's address, node name and gpusim for the GPU."""
    replaced = {
        "web.listen-address": f"127.0.0.1:{port}",
        "node.name": "itest",
        "gpu.backend": "gpusim",
    }
    if not os.stat("/proc").st_mode & 0o005:
        # A sandbox's /proc may be closed to others (mode 0700 where these tests run; 0555
        # on a node), and so is its bind mount at /host/proc: the container's own /proc,
        # which hostPID makes the host's PIDs, stands in.
        replaced["path.procfs"] = "/proc"
    args = []
    for arg in main["args"]:
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        args.append(f"--{name}={replaced[name]}" if name in replaced else arg)
    assert not [a for a in args if re.search(r"\$\(\w+\)", a)], args
    return [*args, f"--gpusim.socket={sim.socket}", "--poll.interval=50ms"]


@pytest.fixture
def exporter_container(
    docker_client: Any, containerd: PrivateContainerd, sim: GpusimService
) -> Iterator[tuple[str, Any]]:
    """The exporter's container as the DaemonSet makes it, and its URL. Removed after."""
    spec = exporter_daemonset()
    (main,) = spec["containers"]
    context, pod_context = main["securityContext"], spec["securityContext"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    mounts: dict[str, dict[str, str]] = {}
    for mount in main["volumeMounts"]:
        host = volumes[mount["name"]]
        if host == "/run/containerd/containerd.sock":
            host = str(containerd.socket)  # the private containerd stands in for the node's
        mode = "ro" if mount.get("readOnly") else "rw"
        mounts[host] = {"bind": mount["mountPath"], "mode": mode}
    mounts[str(sim.dir)] = {"bind": str(sim.dir), "mode": "rw"}  # gpusim stands in for NVML
    assert containerd.socket.stat().st_gid in pod_context["supplementalGroups"]
    port = free_port()
    container = docker_client.containers.run(
        ensure_app_image(docker_client),
        manifest_args(main, port, sim),
        name=f"gpuguard-k8s-exporter-{os.getpid()}",
        labels={"gpuguard.role": "exporter"},
        user=f"{pod_context['runAsUser']}:{pod_context['runAsGroup']}",
        group_add=[str(g) for g in pod_context["supplementalGroups"]],
        read_only=context["readOnlyRootFilesystem"],
        cap_drop=context["capabilities"]["drop"],
        security_opt=["no-new-privileges:true"],
        pid_mode="host" if spec["hostPID"] else None,
        network_mode="host",  # the pod's own address stands in as loopback
        volumes=mounts,
        detach=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", container
    finally:
        container.remove(force=True)


def test_the_exporter_image_follows_containerd_as_the_daemonset_runs_it(
    exporter_container: tuple[str, Any], pods: Callable[..., Pod], sim: GpusimService
) -> None:
    url, container = exporter_container

    def get(path: str) -> requests.Response | None:
        try:
            return requests.get(url + path, timeout=2)
        except requests.RequestException:
            return None

    pod = pods("infer-0", "systemd", {"gpuguard.deadline": "5s"})
    args = workload_args(sim, "deployed.log", "--work-seconds", "20", "--memory-bytes",
                         "30MiB", "--repeat", "3", "--sleep-between", "0.3")  # fmt: skip
    cid = pod.run_python("infer", args, [str(sim.dir)])
    ident = {"namespace": "team-a", "pod": pod.name, "container": "infer",
             "container_id": cid[:12]}  # fmt: skip

    def gpu_memory() -> float | None:
        reply = get("/metrics")
        if reply is None or not reply.ok:
            return None
        return sample_value(reply.text, "gpuguard_container_gpu_memory_bytes", **ident)

    # uid 10001 reaches the root-only socket through group 0, ctr runs from the image, and
    # the pod's GPU process joins through the host's /proc
    try:
        wait_for(gpu_memory, 90, "the pod's GPU memory series from the image", 0.1)
    except AssertionError as exc:
        health = get("/healthz")
        raise AssertionError(
            f"{exc}; /healthz: {health.text if health is not None else 'no answer'}; "
            f"log: {container.logs(tail=30).decode(errors='replace')}"
        ) from None
    text = (get("/metrics") or pytest.fail("no /metrics")).text
    assert sample_value(text, "gpuguard_container_deadline_seconds", **ident) == 5.0
    assert sample_value(text, "gpuguard_exporter_collector_success", source="containerd") == 1
    state = (get("/api/v1/state") or pytest.fail("no state")).json()
    (doc,) = [c for c in state["containers"] if c["id"] == cid]
    assert (doc["namespace"], doc["pod"], doc["name"]) == ("team-a", pod.name, "infer")
    assert state["sources"]["containerd"] is True
