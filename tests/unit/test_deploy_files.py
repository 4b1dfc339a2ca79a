"""Deployment files: Dockerfile, compose, Kubernetes manifests and systemd units.

Nothing here starts a container: images cannot be pulled on CI machines. The checks are
structural (PyYAML, INI parsing), plus ``docker compose config`` / ``docker-compose config``
and ``systemd-analyze verify`` where those tools exist, and every gpuguard command line is
parsed by gpuguard's own argument parser.
"""

from __future__ import annotations

import ast
import configparser
import ipaddress
import os
import posixpath
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from tests.prereq import require_binary, unavailable
from tests.support.scripts import load_script
from tests.support.tlscerts import Pki

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
KUBERNETES = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"

SERVICES = {"exporter", "actuator", "guard", "prometheus", "alertmanager", "grafana"}
# Host paths the compose services may bind besides files of this repository.
HOST_PATHS = {"/proc", "/var/run/docker.sock", "/run/gpusim"}
# Written by the operator per host and ignored by git (deploy/compose/.gitignore).
SECRET_FILES = {"./compose/actuator.token"}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def compose() -> dict[str, Any]:
    document: dict[str, Any] = load_yaml(COMPOSE)
    return document


def expand(text: str) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR:?message}`` with the variables unset."""
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)
    return re.sub(r"\$\{(\w+):\?[^}]*\}", r"<\1>", text)


def flag(argv: list[str], name: str) -> str | None:
    for arg in argv:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def gpuguard_parser() -> Any:
    """gpuguard's real argument parser, or skip (fail under CI) while a part is missing."""
    try:
        from gpuguard.cli import build_parser

        return build_parser()
    except ImportError as exc:
        unavailable(f"gpuguard CLI not importable: {exc}")


def assert_parses(argv: list[str], where: str) -> None:
    parser = gpuguard_parser()
    try:
        parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: gpuguard rejects {shlex.join(argv)}")


def is_loopback_listen(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


# --- Dockerfile ---------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    steps = dockerfile_instructions()
    args = dict(rest.split("=", 1) for kw, rest in steps if kw == "ARG" and "=" in rest)
    froms = [rest for kw, rest in steps if kw == "FROM"]
    assert len(froms) >= 2, "builder stage + runtime stage"
    for base in froms:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base.split()[0])
        assert image == "python:3.11-slim", base
    assert "AS builder" in froms[0]
    final = steps[max(i for i, (kw, _) in enumerate(steps) if kw == "FROM") :]
    runs = " ".join(rest for kw, rest in steps if kw == "RUN")
    assert "pip wheel" in runs
    assert any(kw == "COPY" and "--from=builder" in rest for kw, rest in final)
    assert any(kw == "RUN" and "--no-index" in rest for kw, rest in final), "wheels only"
    users = [rest for kw, rest in final if kw == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert ("ENTRYPOINT", '["gpuguard"]') in final


def test_the_image_carries_ctr_for_the_containerd_source() -> None:
    # gpuguard/exporter/containerd.py and gpuguard/actuator/engine/containerd.py shell out to
    # `ctr`; without
    # it the containerd source refuses to start ("needs ctr on PATH").
    steps = dockerfile_instructions()
    stages: dict[str, list[tuple[str, str]]] = {}
    name = ""
    for keyword, rest in steps:
        if keyword == "FROM":
            name = rest.split(" AS ")[-1] if " AS " in rest else "final"
            stages[name] = []
        elif name:
            stages[name].append((keyword, rest))
    (copy,) = [rest for kw, rest in stages["final"] if kw == "COPY" and "ctr" in rest]
    match = re.fullmatch(r"--from=(\w+) (\S+) (\S+)", copy)
    assert match, copy
    source_stage, source, target = match.groups()
    assert (source, target) == ("/usr/bin/ctr", "/usr/local/bin/ctr")  # on the image's PATH
    installs = " ".join(rest for kw, rest in stages[source_stage] if kw == "RUN")
    assert "apt-get install" in installs and " containerd" in installs
    assert "rm -rf /var/lib/apt/lists" in installs


def test_the_test_image_is_built_from_what_the_dockerfile_copies() -> None:
    # gpuguard.demo.stack.appimage stands in for the Dockerfile where nothing can be pulled.
    from gpuguard.demo.stack.appimage import DOCKERFILE_SOURCES

    copied = [
        source.rstrip("/")
        for keyword, rest in dockerfile_instructions()
        if keyword == "COPY" and not rest.startswith("--from")
        for source in rest.split()[:-1]
    ]
    assert sorted(copied) == sorted(DOCKERFILE_SOURCES)


def test_dockerfile_copies_every_folder_setup_maps_into_the_package() -> None:
    # setup.py installs the data folders inside the package: one the build stage lacks is
    # missing from the wheel, and the image's actuator then finds no rules.
    copied = {
        source.rstrip("/")
        for keyword, rest in dockerfile_instructions()
        if keyword == "COPY" and not rest.startswith("--from")
        for source in rest.split()[:-1]
    }
    tree = ast.parse((ROOT / "setup.py").read_text())
    (mapping,) = [
        node.value for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DATA_PACKAGES"
    ]  # fmt: skip
    mapped = ast.literal_eval(mapping)
    assert set(mapped) == {
        "gpuguard.rules", "gpuguard.dashboards", "gpuguard.deploy.prometheus",
        "gpuguard.deploy.alertmanager",
    }  # fmt: skip
    assert "gpuguard" in copied and "setup.py" in copied
    for target in mapped.values():
        assert (
            target in copied
            or any(target.startswith(c + "/") for c in copied)
            or any(c.startswith(target + "/") for c in copied)
        ), f"deploy/Dockerfile does not copy {target}/"


def test_dockerfile_copies_existing_paths() -> None:
    for keyword, rest in dockerfile_instructions():
        if keyword != "COPY" or rest.startswith("--from"):
            continue
        for source in rest.split()[:-1]:
            assert (ROOT / source).exists(), source


# --- compose ------------------------------------------------------------------------------


def test_compose_services() -> None:
    services = compose()["services"]
    assert set(services) == SERVICES
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        assert not service.get("privileged"), f"{name} must not be privileged"
        assert "no-new-privileges:true" in service.get("security_opt", []), name
    images = {name: s.get("image", "") for name, s in services.items()}
    assert images["prometheus"].startswith("prom/prometheus:")
    assert images["alertmanager"].startswith("prom/alertmanager:")
    assert images["grafana"].startswith("grafana/grafana:")
    for name in ("exporter", "actuator", "guard"):
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
        assert services[name]["labels"]["gpuguard.role"] == name


def test_compose_listens_on_loopback_only() -> None:
    for name, service in compose()["services"].items():
        # Host networking and no published ports: each service binds 127.0.0.1 itself.
        assert service.get("network_mode") == "host", name
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"
        argv = [expand(str(a)) for a in service.get("command", [])]
        listen = flag(argv, "web.listen-address")
        if name != "grafana":
            assert listen is not None and is_loopback_listen(listen), f"{name}: {listen}"
    alertmanager = compose()["services"]["alertmanager"]["command"]
    assert "--cluster.listen-address=" in alertmanager, "gossip would listen on all interfaces"
    grafana = compose()["services"]["grafana"]["environment"]
    assert grafana["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"


def split_volume(volume: str) -> tuple[str, str, str]:
    parts = expand(volume).split(":")
    return parts[0], parts[1], parts[2] if len(parts) > 2 else "rw"


def test_compose_bind_mounts_exist() -> None:
    document = compose()
    named = set(document.get("volumes") or {})
    for name, service in document["services"].items():
        for volume in service.get("volumes", []):
            host, _, _ = split_volume(volume)
            if host in named:
                continue
            if host.startswith("/"):
                assert host in HOST_PATHS, f"{name}: unexpected host path {host}"
            else:
                assert (DEPLOY / host).exists(), f"{name}: {host} does not exist"
    for secret in document["secrets"].values():
        path = secret["file"]
        assert path in SECRET_FILES or (DEPLOY / path).exists(), path
    ignored = (DEPLOY / "compose" / ".gitignore").read_text().split()
    assert all(Path(p).name in ignored for p in SECRET_FILES)


def test_compose_exporter_and_actuator_privileges() -> None:
    services = compose()["services"]
    exporter, actuator = services["exporter"], services["actuator"]
    argv = [expand(a) for a in exporter["command"]]
    assert exporter["pid"] == "host"
    mounts = {split_volume(v)[1]: split_volume(v) for v in exporter["volumes"]}
    assert mounts["/host/proc"][0] == "/proc" and mounts["/host/proc"][2] == "ro"
    assert flag(argv, "path.procfs") == "/host/proc"
    assert "/var/run/docker.sock" in mounts
    # The actuator needs the Docker socket and nothing else from the host.
    assert "pid" not in actuator
    hosts = {split_volume(v)[0] for v in actuator["volumes"]} & HOST_PATHS
    assert hosts == {"/var/run/docker.sock"}
    for service in (exporter, actuator, services["guard"]):
        assert service["cap_drop"] == ["ALL"]
        assert service["read_only"] is True
    # the launch probe's two capabilities, which take effect for uid 0 alone
    assert exporter["cap_add"] == ["BPF", "PERFMON"] and exporter["user"] == "0:0"
    assert "cap_add" not in actuator


def test_compose_guard_outlives_the_actuator() -> None:
    """Its own container on the actuator's state volume: the actuator's PID 1 dying (or
    `docker compose stop actuator`) does not end it, and compose stops it last."""
    services = compose()["services"]
    guard, actuator = services["guard"], services["actuator"]
    state = {split_volume(v)[0]: split_volume(v)[1] for v in actuator["volumes"]}
    guard_state = {split_volume(v)[0]: split_volume(v)[1] for v in guard["volumes"]}
    assert state["actuator-state"] == guard_state["actuator-state"]
    argv = [expand(a) for a in guard["command"]]
    assert flag(argv, "state.dir") == state["actuator-state"]
    assert flag(argv, "state.dir") == flag([expand(a) for a in actuator["command"]], "state.dir")
    assert {split_volume(v)[0] for v in guard["volumes"]} & HOST_PATHS == {"/var/run/docker.sock"}
    assert "guard" in actuator["depends_on"]


@pytest.mark.parametrize("name", ["exporter", "actuator", "guard"])
def test_compose_commands_parse(name: str) -> None:
    argv = [expand(a) for a in compose()["services"][name]["command"]]
    assert argv[0] == name
    assert_parses(argv, f"compose service {name}")


def test_alertmanager_webhook_reaches_the_actuator_service() -> None:
    services = compose()["services"]
    actuator = [expand(a) for a in services["actuator"]["command"]]
    config = load_yaml(DEPLOY / "alertmanager" / "alertmanager.yml")
    urls = [
        hook["url"]
        for receiver in config["receivers"]
        for hook in receiver.get("webhook_configs", [])
    ]
    assert urls
    listen = flag(actuator, "web.listen-address")
    for url in urls:
        parsed = urlparse(url)
        assert f"{parsed.hostname}:{parsed.port}" == listen, url
        assert parsed.path == "/api/v1/alerts"
    # Alertmanager presents the token the actuator checks: one secret, mounted in both.
    credentials = {
        hook["http_config"]["authorization"]["credentials_file"]
        for receiver in config["receivers"]
        for hook in receiver.get("webhook_configs", [])
    }
    targets = {
        name: {s["target"] for s in services[name].get("secrets", [])}
        for name in ("actuator", "alertmanager")
    }
    assert credentials <= targets["alertmanager"]
    assert {flag(actuator, "web.token-file")} <= targets["actuator"]


def test_prometheus_config_and_rules_resolve_in_the_container() -> None:
    service = compose()["services"]["prometheus"]
    config_path = flag(service["command"], "config.file")
    assert config_path is not None
    mounts = {split_volume(v)[1]: split_volume(v)[0] for v in service["volumes"]}
    config_dir = posixpath.dirname(config_path)
    host_dir = (DEPLOY / mounts[config_dir]).resolve()
    config = load_yaml(host_dir / posixpath.basename(config_path))
    for pattern in config["rule_files"]:
        in_container = posixpath.normpath(posixpath.join(config_dir, pattern))
        directory = posixpath.dirname(in_container)
        assert directory in mounts, f"{pattern} -> {in_container} is not mounted"
        on_host = (DEPLOY / mounts[directory]).resolve()
        assert on_host == (ROOT / "rules").resolve()
    # The scrape targets are the listen addresses of the compose services.
    targets = {
        job["job_name"]: target
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])  # gpuguard-tenants: discovered
        for target in static["targets"]
    }
    services = compose()["services"]
    for name in ("exporter", "actuator", "guard"):
        listen = flag([expand(a) for a in services[name]["command"]], "web.listen-address")
        assert targets[f"gpuguard-{name}"] == listen


def test_grafana_datasource_is_the_compose_prometheus() -> None:
    source = load_yaml(ROOT / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
    url = urlparse(source["datasources"][0]["url"])
    listen = flag(compose()["services"]["prometheus"]["command"], "web.listen-address")
    assert f"{url.hostname}:{url.port}" == listen


def compose_command() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
        )
        if probe.returncode == 0:
            return ["docker", "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_config_validates(tmp_path: Path) -> None:
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed")
    env = dict(os.environ, DOCKER_GID="999")
    result = subprocess.run(
        [*command, "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- Kubernetes ---------------------------------------------------------------------------


def kubernetes_documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                found.append((path.name, document))
    return found


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in kubernetes_documents() if d["kind"] == kind}


def test_kubernetes_documents_are_named_objects() -> None:
    documents = kubernetes_documents()
    assert documents
    for path, document in documents:
        assert document.get("apiVersion"), path
        assert document.get("kind"), path
        if document["kind"] != "Kustomization":
            assert document["metadata"]["name"], path
        namespaced = document["kind"] not in (
            "Namespace", "ClusterRole", "ClusterRoleBinding", "Kustomization",
        )  # fmt: skip
        if namespaced:
            assert document["metadata"].get("namespace") == "gpuguard", (path, document["kind"])


def test_core_objects_match_the_apis_schema() -> None:
    """Every object of the core API in the manifests, read by the official client's models
    (pydantic: a wrong type raises) and written back unchanged (an unknown or misspelt field
    is dropped): what the API server would refuse or ignore. Custom resources (monitors,
    rules) are checked field by field in the tests above and below."""
    pytest.importorskip("kubernetes")
    from kubernetes import client
    from kubernetes.client import ApiClient

    models = {
        "DaemonSet": client.V1DaemonSet, "Service": client.V1Service,
        "ServiceAccount": client.V1ServiceAccount, "ClusterRole": client.V1ClusterRole,
        "ClusterRoleBinding": client.V1ClusterRoleBinding, "Namespace": client.V1Namespace,
        "ConfigMap": client.V1ConfigMap,
    }  # fmt: skip
    checked = set()
    for path, document in kubernetes_documents():
        model = models.get(document["kind"])
        if model is None:
            continue
        back = ApiClient().sanitize_for_serialization(model.from_dict(document))
        assert back == document, (path, document["kind"], document["metadata"]["name"])
        checked.add(document["kind"])
    assert {"DaemonSet", "Service", "ClusterRole"} <= checked


def test_kustomization_lists_every_manifest() -> None:
    listed = set(load_yaml(KUBERNETES / "kustomization.yaml")["resources"])
    manifests = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == manifests


def pod_spec(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind("DaemonSet")[name]["spec"]["template"]["spec"]
    return spec


def container(name: str) -> dict[str, Any]:
    (main,) = pod_spec(name)["containers"]
    return main


def env_field(main: dict[str, Any], variable: str) -> str | None:
    for item in main.get("env", []):
        if item["name"] == variable:
            field: str = item["valueFrom"]["fieldRef"]["fieldPath"]
            return field
    return None


def test_exporter_daemonset() -> None:
    spec = pod_spec("gpuguard-exporter")
    assert spec["hostPID"] is True
    assert spec["automountServiceAccountToken"] is False
    assert spec["tolerations"]
    main = container("gpuguard-exporter")
    args = main["args"]
    assert args[0] == "exporter"
    assert flag(args, "path.procfs") == "/host/proc"
    assert flag(args, "node.name") == "$(NODE_NAME)"
    assert env_field(main, "NODE_NAME") == "spec.nodeName"
    assert flag(args, "web.listen-address") == "$(POD_IP):10835"
    assert env_field(main, "POD_IP") == "status.podIP"
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    proc = mounts["/host/proc"]
    assert proc["readOnly"] is True
    assert volumes[proc["name"]]["hostPath"]["path"] == "/proc"
    # A GPU request would take a GPU away from the tenants.
    assert "nvidia.com/gpu" not in str(main.get("resources"))
    # The kubelet's containers through containerd's CRI namespace, in the socket's group
    # (root:root 0660); uid 0 for the launch probe's two capabilities alone
    assert flag(args, "container.source") == "containerd"
    assert_containerd(spec, main, read_only_socket=True)
    assert flag(args, "docker.host") is None
    assert spec["securityContext"]["runAsUser"] == 0
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["BPF", "PERFMON"]}
    assert spec["securityContext"]["supplementalGroups"] == [0]


CONTAINERD_SOCKET = "/run/containerd/containerd.sock"


def hostpath_mounts(spec: dict[str, Any], main: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Host path -> the container's mount of it."""
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    return {
        volumes[m["name"]]["path"]: {**m, "type": volumes[m["name"]].get("type")}
        for m in main["volumeMounts"]
        if m["name"] in volumes
    }


def assert_containerd(spec: dict[str, Any], main: dict[str, Any], read_only_socket: bool) -> None:
    args = main["args"]
    assert flag(args, "containerd.address") == f"unix://{CONTAINERD_SOCKET}"
    assert flag(args, "containerd.namespace") == "k8s.io"
    socket = hostpath_mounts(spec, main)[CONTAINERD_SOCKET]
    assert (socket["mountPath"], socket["type"]) == (CONTAINERD_SOCKET, "Socket")
    assert socket.get("readOnly", False) is read_only_socket
    assert "/var/run/docker.sock" not in hostpath_mounts(spec, main)


def assert_freezer(spec: dict[str, Any], main: dict[str, Any]) -> None:
    """What the cgroup freezer needs: the host's PIDs and cgroup tree, written as root."""
    assert spec["hostPID"] is True
    cgroup = hostpath_mounts(spec, main)["/sys/fs/cgroup"]
    assert cgroup.get("readOnly", False) is False
    sysfs = flag(main["args"], "path.sysfs")
    assert sysfs is not None and cgroup["mountPath"] == f"{sysfs}/fs/cgroup"
    assert flag(main["args"], "path.procfs") in (None, "/proc")  # the host's, by hostPID
    assert spec["securityContext"]["runAsUser"] == 0
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}


def test_actuator_daemonset() -> None:
    spec = pod_spec("gpuguard-actuator")
    main = container("gpuguard-actuator")
    args = main["args"]
    assert args[0] == "actuator"
    assert flag(args, "node.name") == "$(NODE_NAME)"
    assert env_field(main, "NODE_NAME") == "spec.nodeName"
    assert flag(args, "web.token-file")
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert paths == {CONTAINERD_SOCKET, "/sys/fs/cgroup", "/var/lib/gpuguard/actuator"}
    assert_containerd(spec, main, read_only_socket=True)
    assert_freezer(spec, main)


@pytest.mark.parametrize(
    ("name", "root", "capabilities"),
    [
        # uid 0 only for the launch probe's BPF and PERFMON (they take effect for root alone)
        ("gpuguard-exporter", True, {"BPF", "PERFMON"}),
        # uid 0 for containerd's socket and the cgroup files; KILL for the hand-over's signals
        ("gpuguard-actuator", True, {"KILL"}),
        ("gpuguard-guard", True, {"KILL"}),
    ],
)
def test_kubernetes_containers_are_not_privileged(
    name: str, root: bool, capabilities: set[str]
) -> None:
    spec = pod_spec(name)
    assert spec["securityContext"]["runAsNonRoot"] is not root
    assert (spec["securityContext"]["runAsUser"] == 0) is root
    for item in spec["containers"]:
        assert set(item["securityContext"]["capabilities"].get("add", [])) == capabilities
    for item in spec.get("initContainers", []):
        assert set(item["securityContext"]["capabilities"].get("add", [])) == {"CHOWN"}
    for item in spec["containers"] + spec.get("initContainers", []):
        context = item["securityContext"]
        assert context.get("privileged") in (None, False)
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("name", ["gpuguard-exporter", "gpuguard-actuator", "gpuguard-guard"])
def test_kubernetes_args_parse(name: str) -> None:
    args = [re.sub(r"\$\((\w+)\)", "10.0.0.1", a) for a in container(name)["args"]]
    assert_parses(args, f"DaemonSet {name}")


def test_only_the_actuator_reaches_the_kubernetes_api_and_only_for_nodes() -> None:
    # The node mark is a taint and a label on the actuator's Node
    # (gpuguard/actuator/nodemarks/taints.py):
    # get and update on nodes, for the actuator's ServiceAccount, and nothing else.
    assert by_kind("Role") == {} and by_kind("RoleBinding") == {}
    (role,) = by_kind("ClusterRole").values()
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "update"]}
    ]
    (binding,) = by_kind("ClusterRoleBinding").values()
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuguard-actuator", "namespace": "gpuguard"}
    ]
    assert pod_spec("gpuguard-actuator")["automountServiceAccountToken"] is True
    assert flag(container("gpuguard-actuator")["args"], "node.marker") == "kubernetes"
    for name in ("gpuguard-exporter", "gpuguard-guard"):
        assert pod_spec(name)["automountServiceAccountToken"] is False, name
    text = "\n".join(p.read_text() for p in KUBERNETES.glob("*.yaml"))
    assert "gpuguard.io/unprovisionable" not in text, "a taint no code sets"


def test_guard_daemonset_shares_the_actuator_state() -> None:
    guard, actuator = pod_spec("gpuguard-guard"), pod_spec("gpuguard-actuator")
    main = container("gpuguard-guard")
    assert main["args"][0] == "guard"
    state = flag(container("gpuguard-actuator")["args"], "state.dir")
    assert flag(main["args"], "state.dir") == state
    paths = {v["hostPath"]["path"] for v in guard["volumes"] if "hostPath" in v}
    assert paths == {CONTAINERD_SOCKET, "/sys/fs/cgroup", "/var/lib/gpuguard/actuator"}
    assert guard["nodeSelector"] == actuator["nodeSelector"]
    assert_containerd(guard, main, read_only_socket=True)
    assert_freezer(guard, main)
    actuator_main = container("gpuguard-actuator")
    for name in ("containerd.address", "containerd.namespace", "path.sysfs"):
        assert flag(main["args"], name) == flag(actuator_main["args"], name), name
    # the state directory is handed to the uid both run as
    for spec in (guard, actuator):
        (init,) = spec["initContainers"]
        assert init["command"] == ["chown", "0:0", state]
    # Its pod's own address, its /metrics only (GpuguardGuardMissing with the actuator down)
    assert "hostNetwork" not in guard
    assert [p["containerPort"] for p in main["ports"]] == [10838]
    assert flag(main["args"], "web.listen-address") == "$(POD_IP):10838"


def test_service_monitors_label_targets_with_their_node() -> None:
    # GpuguardExporterDown comes from `up`, which has only target labels: without `node`
    # Alertmanager cannot route it to the node's actuator.
    for name, monitor in by_kind("ServiceMonitor").items():
        for endpoint in monitor["spec"]["endpoints"]:
            relabel = endpoint.get("relabelings", [])
            assert {
                "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                "targetLabel": "node",
            } in relabel, name
            assert endpoint.get("honorLabels") is True, name


def test_exporter_service_monitor_keeps_the_tenants_namespace_and_pod() -> None:
    """The operator labels every target with the exporter pod's own namespace, pod and
    container; the exporter's series name the tenant's. honorLabels keeps the exporter's
    where it sets them; the target's are renamed and dropped, so a series with none (a GPU's)
    never takes the exporter pod's."""
    (endpoint,) = by_kind("ServiceMonitor")["gpuguard-exporter"]["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    relabel = endpoint["relabelings"]
    renamed = {r["targetLabel"]: r["sourceLabels"] for r in relabel if "targetLabel" in r}
    assert renamed == {
        "node": ["__meta_kubernetes_pod_node_name"],
        "exporter_namespace": ["__meta_kubernetes_namespace"],
        "exporter_pod": ["__meta_kubernetes_pod_name"],
    }
    (drop,) = [r for r in relabel if r.get("action") == "labeldrop"]
    pattern = re.compile(f"^(?:{drop['regex']})$")  # Prometheus anchors a relabel regex
    assert all(pattern.match(label) for label in ("namespace", "pod", "container"))
    assert not any(pattern.match(label) for label in ("node", "container_id", "gpu", "job"))
    # after the renames: a drop first would lose what they copy (they read __meta_ labels)
    assert relabel.index(drop) == len(relabel) - 1


def load_generator() -> ModuleType:
    return load_script(KUBERNETES / "gen_prometheusrule.py")


def test_prometheusrule_is_generated_from_the_rule_files() -> None:
    generator = load_generator()
    if not generator.rule_files(ROOT / "rules"):
        pytest.skip("rules/*.rules.yml not written yet")
    committed = (KUBERNETES / "prometheusrule.yaml").read_text()
    assert committed == generator.render(), "run: python deploy/kubernetes/gen_prometheusrule.py"
    groups = [
        group
        for path in sorted((ROOT / "rules").glob("*.rules.yml"))
        for group in load_yaml(path)["groups"]
    ]
    document = yaml.safe_load(committed)
    assert document["apiVersion"] == "monitoring.coreos.com/v1"
    assert document["kind"] == "PrometheusRule"
    for group in groups:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["labels"]["namespace"] = "gpuguard"  # for the AlertmanagerConfig's route
    assert document["spec"]["groups"] == groups
    assert document["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    names = [g["name"] for g in groups]
    assert len(names) == len(set(names)), "the operator needs unique group names"


@pytest.mark.parametrize("name", ["gen_prometheusrule", "gen_dashboards"])
def test_a_generator_checks_its_file(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    generator = load_script(KUBERNETES / f"{name}.py")
    assert generator.main(["--check"]) == 0  # the committed file is current: nothing said
    output = generator.OUTPUT
    assert generator.write_or_check(output, "stale\n", True, KUBERNETES / f"{name}.py") == 1
    assert output.read_text() != "stale\n"  # --check writes nothing
    assert capsys.readouterr().out == (
        f"deploy/kubernetes/{output.name} is stale: run deploy/kubernetes/{name}.py\n"
    )


def test_alertmanagerconfig_is_the_shipped_actuator_routes() -> None:
    """deploy/kubernetes/alertmanagerconfig.yaml, merged as the operator merges it, routes
    like the actuator's part of deploy/alertmanager/alertmanager.yml."""
    from tests.support.alertmanagerconfig import merged

    document = load_yaml(KUBERNETES / "alertmanagerconfig.yaml")
    assert document["apiVersion"] == "monitoring.coreos.com/v1alpha1"
    assert document["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    top, receivers, inhibit = merged(document, {("gpuguard-actuator-token", "token"): "x"})
    shipped = load_yaml(DEPLOY / "alertmanager" / "alertmanager.yml")
    prefix = "gpuguard/gpuguard/"
    assert top["matchers"] == ['namespace="gpuguard"', 'gpuguard_action=~".+"']
    for key in ("group_by", "group_wait", "group_interval", "repeat_interval"):
        assert top[key] == shipped["route"][key], key
    actuator_routes = [
        sub for sub in shipped["route"]["routes"] if sub["receiver"] == "gpuguard-actuator"
    ]
    assert [{**sub, "receiver": prefix + sub["receiver"]} for sub in actuator_routes] == top[
        "routes"
    ]
    # One receiver for every node; the actuator's Secret (actuator.yaml) holds its token.
    [receiver] = receivers
    assert receiver["name"] == prefix + "gpuguard-actuator"
    assert len(receiver["webhook_configs"]) >= 2
    shipped_inhibit = [
        {**rule, "source_matchers": ['namespace="gpuguard"', *rule["source_matchers"]],
         "target_matchers": ['namespace="gpuguard"', *rule["target_matchers"]]}
        for rule in shipped["inhibit_rules"]
    ]  # fmt: skip
    assert inhibit == shipped_inhibit


def load_module(name: str) -> ModuleType:
    return load_script(KUBERNETES / f"{name}.py")


def test_dashboard_config_maps_are_generated_for_grafanas_sidecar() -> None:
    generator = load_module("gen_dashboards")
    committed = (KUBERNETES / "dashboards.yaml").read_text()
    assert committed == generator.render(), "run: python deploy/kubernetes/gen_dashboards.py"
    maps = [d for d in yaml.safe_load_all(committed)]
    dashboards = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
    assert len(maps) == len(dashboards)
    for config_map, path in zip(maps, dashboards, strict=True):
        assert config_map["kind"] == "ConfigMap"
        labels = config_map["metadata"]["labels"]
        assert labels["grafana_dashboard"] == "1"
        assert labels["release"] == "kube-prometheus-stack"
        assert config_map["data"] == {path.name: path.read_text()}


def tenants_job() -> dict[str, Any]:
    """The docker_sd job for tenants' latency in deploy/prometheus/prometheus.yml."""
    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gpuguard-tenants"]
    return dict(job)


def test_tenants_pod_monitor_stores_what_the_docker_sd_job_stores() -> None:
    """The SLO rules join gpuguard_tenant_latency_bucket on (container_id, metric, le):
    the PodMonitor must write the series exactly as the docker_sd job does, and find the
    pods and the container by the labels gpuguard reads."""
    from gpuguard import labels
    from tests.support.podmonitor import relabel_configs, sanitize

    monitor = by_kind("PodMonitor")["gpuguard-tenants"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    job = tenants_job()
    assert relabel_configs(endpoint["metricRelabelings"]) == job["metric_relabel_configs"]
    default_profile = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")["global"]
    assert endpoint["interval"] == default_profile["scrape_interval"]
    # every namespace's pods that declare an SLO and where to scrape it
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert monitor["spec"]["selector"] == {"matchExpressions": [
        {"key": labels.SLO_METRIC, "operator": "Exists"},
        {"key": labels.SLO_PORT, "operator": "Exists"},
    ]}  # fmt: skip
    relabel = endpoint["relabelings"]
    sources = {source for rule in relabel for source in rule.get("sourceLabels", [])}
    for label in (labels.CONTAINER, labels.SLO_PORT):
        assert f"__meta_kubernetes_pod_label_{sanitize(label)}" in sources, label
    assert {"__address__", "container_id"} <= {r.get("targetLabel") for r in relabel}
    for rule in relabel:
        if rule.get("action") in ("keepequal", "dropequal"):  # the operator refuses more
            assert set(rule) == {"action", "sourceLabels", "targetLabel"}, rule


def test_tenants_pod_monitor_renders_a_config_promtool_accepts(tmp_path: Path) -> None:
    from tests.support.podmonitor import scrape_config

    monitor = by_kind("PodMonitor")["gpuguard-tenants"]
    job = scrape_config(monitor, 0, [str(tmp_path / "pods.json")])
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    (tmp_path / "pods.json").write_text("[]")
    done = subprocess.run([require_binary("promtool"), "check", "config", str(path)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_operator_objects_carry_the_release_label() -> None:
    kinds = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "AlertmanagerConfig"}
    documents = [d for _, d in kubernetes_documents() if d["kind"] in kinds]
    assert {d["kind"] for d in documents} == kinds
    for document in documents:
        assert document["metadata"]["labels"].get("release") == "kube-prometheus-stack", (
            document["kind"], document["metadata"]["name"],
        )  # fmt: skip


# --- systemd --------------------------------------------------------------------------------


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((SYSTEMD / name).read_text())
    return parser


def exec_start(name: str) -> list[str]:
    line = unit(name)["Service"]["ExecStart"].replace("\\\n", " ")
    return shlex.split(" ".join(line.split()))


def unit_defaults(name: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for assignment in shlex.split(unit(name)["Service"].get("Environment", "")):
        key, _, value = assignment.partition("=")
        values[key] = value
    return values


@pytest.mark.parametrize(
    ("name", "subcommand"),
    [
        ("gpuguard-exporter.service", "exporter"),
        ("gpuguard-actuator.service", "actuator"),
        ("gpuguard-guard.service", "guard"),
        ("gpuguard-placer.service", "placer"),
    ],
)
def test_systemd_exec_start(name: str, subcommand: str) -> None:
    argv = exec_start(name)
    assert argv[0].startswith("/") and argv[0].endswith("/gpuguard")
    assert argv[1] == subcommand
    defaults = unit_defaults(name)
    defaults.update(CREDENTIALS_DIRECTORY="/run/credentials/x", STATE_DIRECTORY="/var/lib/x")
    resolved = []
    for arg in argv[1:]:
        if re.fullmatch(r"\$\w+", arg):  # $VAR: split into words, empty when unset
            continue
        resolved.append(re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], arg))
    if subcommand != "guard":  # the guard listens nowhere
        assert is_loopback_listen(flag(resolved, "web.listen-address") or "")
    assert_parses(resolved, name)


def test_systemd_units_restart_and_harden() -> None:
    for name in (
        "gpuguard-exporter.service",
        "gpuguard-actuator.service",
        "gpuguard-guard.service",
        "gpuguard-placer.service",
        "gpusim.service",
    ):
        service = unit(name)["Service"]
        # The guard comes back even after a clean exit: it must always be there.
        restart = "always" if name == "gpuguard-guard.service" else "on-failure"
        assert service["Restart"] == restart, name
        assert service["NoNewPrivileges"] == "yes", name
        assert service["ProtectSystem"] == "strict", name
        probe = "CAP_BPF CAP_PERFMON" if name == "gpuguard-exporter.service" else ""
        assert service.get("CapabilityBoundingSet") == probe, name
        assert "User" in service or service.get("DynamicUser") == "yes", name
    exporter = unit("gpuguard-exporter.service")["Service"]
    # the launch probe's two capabilities, nothing more
    assert exporter["AmbientCapabilities"] == "CAP_BPF CAP_PERFMON"
    # Other users' /proc/<pid>/cgroup and NVML's /dev/nvidia* must stay visible.
    assert exporter["ProtectProc"] == "default"
    assert exporter["ProcSubset"] == "all"
    assert exporter.get("PrivateDevices", "no") == "no"
    actuator = unit("gpuguard-actuator.service")["Service"]
    assert actuator["KillSignal"] == "SIGTERM"
    assert "ExecStopPost" not in actuator  # SIGTERM itself resumes (unit comment)
    gpusim = exec_start("gpusim.service")
    assert gpusim[0].endswith("/gpusim") and gpusim[1] == "serve"


def test_systemd_guard_is_its_own_unit_on_the_actuator_state() -> None:
    actuator, guard = unit("gpuguard-actuator.service"), unit("gpuguard-guard.service")
    for part in (actuator, guard):
        assert part["Service"]["User"] == "gpuguard"  # one dynamic UID for both
        assert part["Service"]["StateDirectory"] == "gpuguard/actuator"
        assert part["Service"]["StateDirectoryMode"] == "0700"
    assert "gpuguard-guard.service" in actuator["Unit"]["Wants"]
    assert "gpuguard-actuator.service" in guard["Unit"]["Before"]  # stopped after it
    assert "PartOf" not in guard["Unit"] and "BindsTo" not in guard["Unit"]
    # Loopback only: Prometheus scrapes its /metrics there (GpuguardGuardMissing).
    assert "PrivateNetwork" not in guard["Service"]
    assert guard["Service"]["IPAddressDeny"] == "any"
    assert guard["Service"]["IPAddressAllow"] == "localhost"
    assert flag(exec_start("gpuguard-guard.service"), "state.dir") == "${STATE_DIRECTORY}"


def test_systemd_env_example_sets_only_known_variables() -> None:
    used: set[str] = set()
    for path in SYSTEMD.glob("*.service"):
        used.update(re.findall(r"\$\{?(\w+)\}?", path.read_text()))
    assignments = [
        line.split("=", 1)[0]
        for line in (SYSTEMD / "gpuguard.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert assignments and set(assignments) <= used


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("gpuguard", "gpusim"):
        stub = bin_dir / program
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    units = []
    for path in sorted(SYSTEMD.glob("*.service")):
        # verify checks ExecStart is executable: point it at stubs in place of /opt/gpuguard.
        text = path.read_text().replace("/opt/gpuguard/bin/", f"{bin_dir}/")
        (tmp_path / path.name).write_text(text)
        units.append(str(tmp_path / path.name))
    result = subprocess.run(
        [tool, "verify", *units], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    output = result.stdout + result.stderr
    if "Failed to" in output and "bus" in output.lower():
        pytest.skip(f"systemd-analyze cannot run here: {output.strip()}")
    assert result.returncode == 0, output
    assert not re.search(r"Unknown (key|section)|Invalid|not executable|Ignoring", output), output


# --- addresses ----------------------------------------------------------------------------


def deployment_texts() -> list[Path]:
    paths = [DEPLOY / "Dockerfile", COMPOSE, *(DEPLOY / "compose").glob("*")]
    paths += [*KUBERNETES.glob("*.yaml"), *SYSTEMD.glob("*")]
    paths += [*(ROOT / "grafana" / "provisioning").rglob("*.yaml")]
    return [p for p in paths if p.is_file()]


def test_no_address_but_loopback() -> None:
    for path in deployment_texts():
        for address in re.findall(r"\b\d{1,3}(?:\.\d{1,3}){3}\b", path.read_text()):
            assert ipaddress.ip_address(address).is_loopback, f"{path.name}: {address}"


# --- TLS (--web.config.file) on Kubernetes -------------------------------------------------


def web_config_secret() -> dict[str, str]:
    data: dict[str, str] = by_kind("Secret")["gpuguard-web-config"]["stringData"]
    return data


def secret_mounts(name: str) -> dict[str, str]:
    """Secret name -> mount path in the DaemonSet ``name``'s container."""
    volumes = {v["name"]: v for v in pod_spec(name)["volumes"]}
    return {
        volumes[m["name"]]["secret"]["secretName"]: m["mountPath"]
        for m in container(name)["volumeMounts"]
        if "secret" in volumes[m["name"]]
    }


@pytest.mark.parametrize(
    ("name", "config"),
    [("gpuguard-exporter", "exporter.yml"), ("gpuguard-actuator", "actuator.yml")],
)
def test_kubernetes_servers_read_their_web_config_from_the_secret(name: str, config: str) -> None:
    args = container(name)["args"]
    mounts = secret_mounts(name)
    assert flag(args, "web.config.file") == f"{mounts['gpuguard-web-config']}/{config}"
    assert mounts["gpuguard-tls"] == "/etc/gpuguard/tls"
    assert container(name)["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    # the Secret files are 0440, owned by root: the pod runs as root, or its group owns them
    context = pod_spec(name)["securityContext"]
    assert context.get("runAsUser") == 0 or context.get("fsGroup") == 10001, context


def test_kubernetes_web_configs_are_valid_with_a_real_certificate(pki: Pki, tmp_path: Path) -> None:
    from gpuguard.web.client import load_client_config
    from gpuguard.web.webconfig import load_web_config

    for key, source in (("tls.crt", pki.server_cert), ("tls.key", pki.server_key),
                        ("ca.crt", pki.ca)):  # fmt: skip
        (tmp_path / key).write_bytes(source.read_bytes())
    for name, text in web_config_secret().items():
        path = tmp_path / name
        path.write_text(text.replace("/etc/gpuguard/tls", str(tmp_path)))
        if name == "exporter-client.yml":
            assert load_client_config(path, "exporter.http-config-file").ca_file is not None
        else:
            config = load_web_config(path)
            assert config.scheme == "https", name
    args = container("gpuguard-actuator")["args"]
    assert flag(args, "exporter.http-config-file") == "/etc/gpuguard/web/exporter-client.yml"


def test_kubernetes_tls_names_are_the_services() -> None:
    """Prometheus, Alertmanager and the actuator verify the certificate against the Service
    names (the targets are pod and node IPs, which no certificate can list in advance)."""
    monitors = by_kind("ServiceMonitor")
    for name in ("gpuguard-exporter", "gpuguard-actuator"):
        (endpoint,) = monitors[name]["spec"]["endpoints"]
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"]["serverName"] == f"{name}.gpuguard.svc"
        assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "gpuguard-tls", "key": "ca.crt"}
    exporter_url = flag(container("gpuguard-actuator")["args"], "exporter.url")
    assert exporter_url == "https://gpuguard-exporter.gpuguard.svc:10835"
    config = by_kind("AlertmanagerConfig")["gpuguard"]
    for webhook in config["spec"]["receivers"][0]["webhookConfigs"]:
        assert webhook["url"].startswith("https://")
        tls = webhook["httpConfig"]["tlsConfig"]
        assert tls["serverName"] == "gpuguard-actuator.gpuguard.svc"


def test_network_policies_admit_only_the_callers() -> None:
    policies = by_kind("NetworkPolicy")

    def admitted(name: str) -> tuple[set[tuple[str | None, str]], list[int]]:
        (rule,) = policies[name]["spec"]["ingress"]
        peers = set()
        for peer in rule["from"]:
            assert set(peer) <= {"namespaceSelector", "podSelector"}  # no ipBlock: no "all"
            namespace = peer.get("namespaceSelector", {}).get("matchLabels", {})
            pod = peer["podSelector"]["matchLabels"]
            who = pod.get("app.kubernetes.io/component") or pod["app.kubernetes.io/name"]
            peers.add((namespace.get("kubernetes.io/metadata.name"), who))
        return peers, [p["port"] for p in rule["ports"]]

    assert admitted("gpuguard-exporter") == (
        {("monitoring", "prometheus"), (None, "actuator")},
        [10835],
    )
    assert admitted("gpuguard-actuator") == (
        {("monitoring", "prometheus"), ("monitoring", "alertmanager")},
        [10836],
    )
    for name, policy in policies.items():
        component = name.removeprefix("gpuguard-")
        assert (
            policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        )
        assert policy["spec"]["policyTypes"] == ["Ingress"]


# --- TLS (--web.config.file) with compose ---------------------------------------------------

COMPOSE_TLS = DEPLOY / "compose.tls.yaml"


def gen_tls() -> ModuleType:
    return load_script(DEPLOY / "compose" / "gen_tls.py")


def test_compose_tls_overlay_keeps_every_flag_and_adds_tls() -> None:
    """Compose replaces a command as a whole: the overlay's must be compose.yaml's plus TLS."""
    base, overlay = compose()["services"], load_yaml(COMPOSE_TLS)["services"]
    added = {
        "exporter": {"--web.config.file=/etc/gpuguard/tls/exporter-web.yml"},
        "actuator": {"--web.config.file=/etc/gpuguard/tls/actuator-web.yml",
                     "--exporter.http-config-file=/etc/gpuguard/tls/exporter-client.yml",
                     "--exporter.url=https://127.0.0.1:10835"},
        "prometheus": {"--config.file=/etc/gpuguard/tls/prometheus.yml"},
        "alertmanager": {"--config.file=/etc/gpuguard/tls/alertmanager.yml"},
    }  # fmt: skip
    for name, flags in added.items():
        command = overlay[name]["command"]
        replaced = {a.split("=")[0] for a in flags} & {"--exporter.url", "--config.file"}
        kept = [a for a in base[name]["command"] if a.split("=")[0] not in replaced]
        assert set(command) == set(kept) | flags, name
        assert "./compose/tls:/etc/gpuguard/tls:ro" in overlay[name]["volumes"]
        if name in ("exporter", "actuator"):
            assert_parses([expand(a) for a in command], f"compose.tls.yaml {name}")
    assert "tls/" in (DEPLOY / "compose" / ".gitignore").read_text().split()


def test_compose_tls_material_is_valid(tmp_path: Path) -> None:
    """What gen_tls.py makes: certificates the web configs accept, configs promtool and
    amtool accept, and a compose project that docker compose accepts with the overlay."""
    from gpuguard.web.client import load_client_config
    from gpuguard.web.webconfig import load_web_config

    require_binary("openssl")
    out = tmp_path / "tls"
    gen_tls().generate(out, container_dir=str(out))
    for name in ("exporter-web.yml", "actuator-web.yml"):
        config = load_web_config(out / name)
        assert config.scheme == "https" and config.users, name
    assert load_web_config(out / "exporter-web.yml").tls.client_auth == (  # type: ignore[union-attr]
        "RequireAndVerifyClientCert"
    )
    client = load_client_config(out / "exporter-client.yml", "exporter.http-config-file")
    assert client.username == "actuator" and client.password
    assert oct((out / "server.key").stat().st_mode & 0o777) == "0o640"
    prometheus = load_yaml(out / "prometheus.yml")
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert jobs["gpuguard-exporter"]["scheme"] == jobs["gpuguard-actuator"]["scheme"] == "https"
    assert "scheme" not in jobs["gpuguard-guard"]  # the guard serves plain HTTP on loopback
    promtool = require_binary("promtool")
    check = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(out / "prometheus.yml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    check = subprocess.run(
        [require_binary("amtool"), "check-config", str(out / "alertmanager.yml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    again = {p.name: p.read_bytes() for p in out.glob("*.password")}
    gen_tls().generate(out, container_dir=str(out))  # renewal keeps keys and passwords
    assert {p.name: p.read_bytes() for p in out.glob("*.password")} == again
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed")
    result = subprocess.run(
        [*command, "-f", str(COMPOSE), "-f", str(COMPOSE_TLS), "config", "-q"],
        capture_output=True, text=True, timeout=60,
        env=dict(os.environ, DOCKER_GID="999"), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
