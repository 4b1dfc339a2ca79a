"""gpuguard's image as deploy/kubernetes runs it, on a Kubernetes-like node.

The container is made from the DaemonSet itself: its args (the containerd source, socket
and namespace), its user and supplementary groups (uid 10001 in group 0, the group of
containerd's root-only socket), read-only root, no capabilities, the host's PIDs and /proc,
and the socket mounted where the manifest mounts it; TLS from its web config, with a test
CA's certificate in place of the ``gpuguard-tls`` Secret. It must follow a real private
containerd through the image's own ``ctr``, join a pod's GPU process through the host's
/proc, and name the pod on its series. The image is ``gpuguard/gpuguard:local``
(``gpuguard.demo.stack.appimage``: deploy/Dockerfile's stand-in where nothing can be pulled,
with the host's ``ctr`` where the Dockerfile copies Debian's).

The actuator's container, made from actuator.yaml the same way (uid 0 with CAP_KILL alone,
the host's cgroups, host PIDs), must admit managed pods through the cgroup freezer and hand
them to containerd. An exporter process on the host feeds it; a loopback stand-in of the
API's node endpoints (``tests/support/kube_stand_in.py``) takes its node marks.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from containerd_support import Pod, exited
from exporter_support import ExporterProcess, sample_value, workload_args
from test_actuator_live import arrival_order, kernel_intervals

from gpuguard.actuator.audit import read_audit
from gpuguard.demo.stack.appimage import ensure_app_image
from gpuguard.demo.stack.containerd import PrivateContainerd
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.process import free_port
from tests.support.kube_stand_in import KubeStandIn, node
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

KUBERNETES = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
SOCKET = "/run/containerd/containerd.sock"


#: capabilities Linux 5.8 added, which Docker Engine names only from 23.0 (Debian 12's
#: docker.io is 20.10): the DaemonSet runs on containerd, which names them
NEWER_CAPABILITIES = {"BPF", "PERFMON"}


def engine_capabilities(client: Any, wanted: list[str] | None) -> list[str] | None:
    """The DaemonSet's added capabilities, less those this engine's version cannot name (the
    launch probe's: it is not what these tests run; test_launchprobe_live.py runs it)."""
    major = int(client.version()["Version"].split(".")[0])
    if wanted is None or major >= 23:
        return wanted
    return [cap for cap in wanted if cap not in NEWER_CAPABILITIES] or None


def daemonset(file: str) -> dict[str, Any]:
    """The pod spec of the DaemonSet in ``deploy/kubernetes/<file>``."""
    (found,) = [
        d for d in yaml.safe_load_all((KUBERNETES / file).read_text()) if d["kind"] == "DaemonSet"
    ]
    spec: dict[str, Any] = found["spec"]["template"]["spec"]
    return spec


def with_flags(args: list[str], replaced: dict[str, str], *extra: str) -> list[str]:
    """The manifest's args with some flags' values replaced, and more flags after them."""
    out = []
    for arg in args:
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        out.append(f"--{name}={replaced[name]}" if name in replaced else arg)
    assert not [a for a in out if re.search(r"\$\(\w+\)", a)], out
    return [*out, *extra]


def flag_value(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return value


def run_as_the_daemonset_runs_it(
    client: Any,
    spec: dict[str, Any],
    args: list[str],
    host_paths: dict[str, str],
    extra_mounts: dict[str, dict[str, str]],
) -> Any:
    """The DaemonSet's one container as a Docker container: its user, groups, capabilities,
    read-only root, host PIDs and host paths (``host_paths`` says what stands in for a node's
    path here; ``extra_mounts`` what stands in for a Secret or the GPU), on the host network
    (the pod's address stands in as loopback)."""
    (main,) = spec["containers"]
    context, pod_context = main["securityContext"], spec["securityContext"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts: dict[str, dict[str, str]] = {}
    for mount in main["volumeMounts"]:
        if "hostPath" not in volumes[mount["name"]]:
            continue  # a Secret: the caller's extra_mounts stand in
        host = volumes[mount["name"]]["hostPath"]["path"]
        mode = "ro" if mount.get("readOnly") else "rw"
        mounts[host_paths.get(host, host)] = {"bind": mount["mountPath"], "mode": mode}
    mounts.update(extra_mounts)
    return client.containers.run(
        ensure_app_image(client),
        args,
        name=f"gpuguard-k8s-{args[0]}-{os.getpid()}",
        labels={"gpuguard.role": args[0]},
        user=f"{pod_context['runAsUser']}:{pod_context['runAsGroup']}",
        group_add=[str(g) for g in pod_context.get("supplementalGroups", [])],
        read_only=context["readOnlyRootFilesystem"],
        cap_drop=context["capabilities"]["drop"],
        cap_add=engine_capabilities(client, context["capabilities"].get("add")),
        security_opt=["no-new-privileges:true"],
        pid_mode="host" if spec.get("hostPID") else None,
        network_mode="host",
        volumes=mounts,
        detach=True,
    )


def web_secrets(directory: Path) -> tuple[dict[str, dict[str, str]], Path]:
    """What stands in for the Secrets ``gpuguard-web-config`` (webconfig.yaml's own files)
    and ``gpuguard-tls`` (a test CA's certificate for 127.0.0.1): the mounts, and the CA."""
    from tests.support.tlscerts import make_pki

    pki = make_pki(directory / "pki")
    tls, web = directory / "tls", directory / "web"
    for folder in (tls, web):
        folder.mkdir(mode=0o755)
    for name, source in (("tls.crt", pki.server_cert), ("tls.key", pki.server_key),
                         ("ca.crt", pki.ca)):  # fmt: skip
        (tls / name).write_bytes(source.read_bytes())
        (tls / name).chmod(0o444)  # the kubelet's fsGroup stands in: any uid may read
    (secret,) = [
        d for d in yaml.safe_load_all((KUBERNETES / "webconfig.yaml").read_text())
        if d["kind"] == "Secret" and d["metadata"]["name"] == "gpuguard-web-config"
    ]  # fmt: skip
    for name, text in secret["stringData"].items():
        (web / name).write_text(text)
        (web / name).chmod(0o444)
    mounts = {str(tls): {"bind": "/etc/gpuguard/tls", "mode": "ro"},
              str(web): {"bind": "/etc/gpuguard/web", "mode": "ro"}}  # fmt: skip
    return mounts, pki.ca


@pytest.fixture
def exporter_container(
    docker_client: Any, containerd: PrivateContainerd, sim: GpusimService, tmp_path: Path
) -> Iterator[tuple[str, Any, Path]]:
    """The exporter's container as exporter.yaml makes it (TLS from its Secrets), its URL
    and the CA that signed its certificate. Removed after."""
    spec = daemonset("exporter.yaml")
    (main,) = spec["containers"]
    assert containerd.socket.stat().st_gid in spec["securityContext"]["supplementalGroups"]
    port = free_port()
    replaced = {"web.listen-address": f"127.0.0.1:{port}", "node.name": "itest",
                "gpu.backend": "gpusim"}  # fmt: skip
    if not os.stat("/proc").st_mode & 0o005:
        # A sandbox's /proc may be closed to others (mode 0700 where these tests run; 0555
        # on a node), and so is its bind mount at /host/proc: the container's own /proc,
        # which hostPID makes the host's PIDs, stands in.
        replaced["path.procfs"] = "/proc"
    args = with_flags(main["args"], replaced, f"--gpusim.socket={sim.socket}",
                      "--poll.interval=50ms")  # fmt: skip
    host_paths = {SOCKET: str(containerd.socket)}  # the private containerd stands in
    mounts, ca = web_secrets(tmp_path)
    mounts[str(sim.dir)] = {"bind": str(sim.dir), "mode": "rw"}  # stands in for NVML
    container = run_as_the_daemonset_runs_it(docker_client, spec, args, host_paths, mounts)
    try:
        yield f"https://127.0.0.1:{port}", container, ca
    finally:
        container.remove(force=True)


def test_the_exporter_image_follows_containerd_as_the_daemonset_runs_it(
    exporter_container: tuple[str, Any, Path], pods: Callable[..., Pod], sim: GpusimService
) -> None:
    url, container, ca = exporter_container

    def get(path: str) -> requests.Response | None:
        try:  # over TLS, as the ServiceMonitor scrapes it
            return requests.get(url + path, timeout=2, verify=str(ca))
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


@pytest.fixture
def sim_time_scale() -> float:
    return 0.1  # a 13,312 matmul kernel lasts ~1.1 s


def test_the_actuator_image_freezes_pods_as_the_daemonset_runs_it(
    docker_client: Any,
    containerd: PrivateContainerd,
    sim: GpusimService,
    pods: Callable[..., Pod],
    tmp_path: Path,
) -> None:
    """actuator.yaml's container (uid 0 with CAP_KILL alone, read-only root, host PIDs, the
    host's cgroups at /host/sys/fs/cgroup, containerd's socket) admits three managed pods'
    tasks one at a time: each waiting one frozen in its cgroup, then handed to containerd."""
    exporter = ExporterProcess(
        tmp_path, f"unix://{tmp_path}/no-docker.sock", sim.socket, "--poll.interval=20ms",
        "--container.source=containerd", f"--containerd.address={containerd.address}",
    ).start()  # fmt: skip
    api = KubeStandIn({"itest": node("itest")}).start()
    state, token = tmp_path / "state", tmp_path / "token"
    state.mkdir(mode=0o700)
    token.mkdir()
    (token / "token").write_text("deployed-k8s-token")
    spec = daemonset("actuator.yaml")
    (main,) = spec["containers"]
    port = free_port()
    replaced = {"web.listen-address": f"127.0.0.1:{port}", "exporter.url": exporter.url,
                "node.name": "itest"}  # fmt: skip
    args = with_flags(main["args"], replaced, "--mode=fast",
                      f"--kubernetes.api-server={api.url}")  # fmt: skip
    state_dir = flag_value(args, "state.dir")
    host_paths = {SOCKET: str(containerd.socket), state_dir: str(state)}
    secrets, ca = web_secrets(tmp_path)
    secrets[str(token)] = {"bind": "/etc/gpuguard/token", "mode": "ro"}
    actuator = run_as_the_daemonset_runs_it(docker_client, spec, args, host_paths, secrets)
    try:
        url = f"https://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                return requests.get(url + "/healthz", timeout=1, verify=str(ca)).ok
            except requests.RequestException:
                return False

        wait_for(healthy, 60, "the actuator's container to answer /healthz", interval=0.2)
        start_at = time.time() + 3.0
        ids = {}
        for i in range(3):
            pod = pods(f"dep-{i}", "systemd" if i % 2 else "cgroupfs",
                       {"gpuguard.managed": "true", "gpuguard.deadline": "60s"})  # fmt: skip
            # 4 GiB of input (~0.55 s to copy): the window in which a waiting task must be
            # frozen, wide enough for a containerized actuator on a loaded 2-core machine
            args = workload_args(sim, f"dep-{i}.log", "--size", "13312", "--memory-bytes",
                                 "6GiB", "--start-at", f"{start_at + 0.15 * i:.3f}")  # fmt: skip
            ids[pod.name] = pod.run_python("infer", args, [str(sim.dir)])
        deadline = time.monotonic() + 60
        while not all(exited(containerd, cid) for cid in ids.values()):
            logs = actuator.logs(tail=40).decode(errors="replace")
            assert time.monotonic() < deadline, logs
            time.sleep(0.2)
    finally:
        actuator.stop(timeout=30)  # SIGTERM: it resumes what it paused
        logs = actuator.logs(tail=40).decode(errors="replace")
        actuator.remove(force=True)
        api.stop()
        exporter.stop()

    kernels = kernel_intervals(sim, list(ids))
    ordered = sorted((k[0], name) for name, k in kernels.items() if k)
    assert [name for _, name in ordered] == arrival_order(sim, list(ids)), (ordered, logs)
    for (a, _), (b, _) in itertools.pairwise(ordered):
        assert b[0] >= a[1] - 1e-3, f"two managed kernels overlapped: {a} {b}"
    audit = read_audit(state / "audit.jsonl")
    outcome = ("action", "pause", "ok")
    pauses = [r for r in audit if (r["event"], r.get("action"), r.get("result")) == outcome]
    waited = {ids["dep-1"], ids["dep-2"]}
    assert waited <= {r["container_id"] for r in pauses}, (audit, logs)
    # frozen in the cgroup as uid 0 without DAC_OVERRIDE, then containerd's own pause
    assert all(r["method"] == "cgroup" for r in pauses), pauses
    told = [r for r in audit if r["event"] == "runtime_pause"]
    assert told and all(r["result"] in ("ok", "cancelled", "skipped") for r in told), told
    assert all(r["engine"] == "containerd" for r in told), told
