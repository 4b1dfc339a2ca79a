"""deploy/kubernetes/scheduler/: the KubeSchedulerConfiguration that enables the extender,
against kube-scheduler's v1 config types (``k8s.io/kube-scheduler/config/v1/types.go``,
``Extender``, ``ExtenderManagedResource``, ``ExtenderTLSConfig``) and its validation
(``validateExtenders``); and the placer it calls, as the API and gpuguard's own flags read it.

No kube-scheduler can run here: what it would do with the file is taken from its source
(``pkg/scheduler/extender.go``: ``strings.TrimRight(urlPrefix, "/") + "/" + verb``, POST,
``Content-Type: application/json``), and the verbs are posted that way to a real placer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import yaml

from gpuguard.demo.stack.process import free_port
from gpuguard.placer import extender
from gpuguard.placer.http import placer_server
from gpuguard.placer.service import Placer, Settings
from gpuguard.web.webconfig import parse_web_config
from tests.support.tlscerts import Pki
from tests.unit.test_deploy_files import DEPLOY, assert_parses
from tests.unit.test_placer_api import StaticSource
from tests.unit.test_placer_extender import CLUSTER, REAL_TIME, scheduler_body, v1_pod

SCHEDULER = DEPLOY / "kubernetes" / "scheduler"
CONFIG = SCHEDULER / "kube-scheduler-config.yaml"

#: json tags of KubeSchedulerConfiguration (config/v1), with the inlined TypeMeta and
#: DebuggingConfiguration fields
CONFIG_FIELDS = {
    "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
    "enableProfiling", "enableContentionProfiling", "percentageOfNodesToScore",
    "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders",
    "delayCacheUntilActive",
}  # fmt: skip
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
    "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources",
    "ignorable",
}  # fmt: skip
TLS_FIELDS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData",
              "caData"}  # fmt: skip
MANAGED_RESOURCE_FIELDS = {"name", "ignoredByScheduler"}
#: metav1.Duration as Go's time.ParseDuration writes it (the units the file may use)
_GO_DURATION = re.compile(r"^(?:([0-9]+(?:\.[0-9]+)?)(ms|s|m|h))+$")
_GO_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(text: str) -> float:
    assert _GO_DURATION.match(text), f"{text!r} is not a Go duration"
    return sum(float(n) * _GO_UNITS[u] for n, u in re.findall(r"([0-9.]+)(ms|s|m|h)", text))


def scheduler_config() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    return document


def gpuguard_extender() -> dict[str, Any]:
    [entry] = scheduler_config()["extenders"]
    assert isinstance(entry, dict)
    return entry


def placer_objects() -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all((SCHEDULER / "placer.yaml").read_text())
    return {d["kind"]: d for d in docs if d}


def test_the_config_uses_only_kube_schedulers_v1_fields() -> None:
    config = scheduler_config()
    assert (config["apiVersion"], config["kind"]) == (
        "kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration",
    )  # fmt: skip
    assert set(config) <= CONFIG_FIELDS
    entry = gpuguard_extender()
    assert set(entry) <= EXTENDER_FIELDS, set(entry) - EXTENDER_FIELDS
    assert set(entry["tlsConfig"]) <= TLS_FIELDS
    for resource in entry["managedResources"]:
        assert set(resource) <= MANAGED_RESOURCE_FIELDS


def test_the_config_passes_kube_schedulers_validation() -> None:
    """validateExtenders: a prioritizer needs a positive weight, at most one binder, managed
    resources are extended resource names (a domain other than kubernetes.io), each once."""
    entry = gpuguard_extender()
    assert entry["prioritizeVerb"] and isinstance(entry["weight"], int) and entry["weight"] > 0
    assert "bindVerb" not in entry  # binding stays kube-scheduler's
    names = [r["name"] for r in entry["managedResources"]]
    assert len(names) == len(set(names))
    for name in names:
        domain, _, resource = name.partition("/")
        assert "." in domain and resource and not domain.endswith("kubernetes.io"), name


def test_the_extender_sees_gpu_pods_only_and_fails_open() -> None:
    entry = gpuguard_extender()
    assert entry["managedResources"] == [
        {"name": "nvidia.com/gpu", "ignoredByScheduler": False}
    ]  # kube-scheduler still counts the device plugin's GPUs itself
    assert entry["ignorable"] is True
    assert entry["nodeCacheCapable"] is True  # names only: the placer has the records
    assert "preemptVerb" not in entry


def test_kube_scheduler_authenticates_by_certificate_within_its_timeout() -> None:
    entry = gpuguard_extender()
    assert entry["enableHTTPS"] is True and urlsplit(entry["urlPrefix"]).scheme == "https"
    tls = entry["tlsConfig"]
    assert not tls.get("insecure") and {"caFile", "certFile", "keyFile"} <= set(tls)
    args = placer_objects()["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    timeout = next(a.split("=", 1)[1] for a in args if a.startswith("--prometheus.timeout="))
    # the placer answers a slow Prometheus (503, counted) before kube-scheduler gives up
    assert go_duration(timeout) < go_duration(entry["httpTimeout"]) <= 5.0


def test_the_url_names_the_placers_service_and_port() -> None:
    entry = gpuguard_extender()
    url = urlsplit(entry["urlPrefix"])
    service = placer_objects()["Service"]
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.hostname == entry["tlsConfig"]["serverName"]
    assert url.port == service["spec"]["ports"][0]["port"]
    assert url.path.rstrip("/") == extender.PATH_PREFIX


@pytest.fixture
def placer_url() -> Iterator[str]:
    placer = Placer(StaticSource(list(CLUSTER)), Settings(), clock=lambda: 1000.0)
    port = free_port()
    server = placer_server(("127.0.0.1", port), placer, None, with_extender=True)
    server.serve_in_thread()
    yield f"127.0.0.1:{port}"
    server.shutdown()
    server.server_close()


def test_the_verbs_reach_the_placer_as_kube_scheduler_builds_their_urls(placer_url: str) -> None:
    entry = gpuguard_extender()
    # the shipped prefix, with the Service's host swapped for this test's loopback placer
    prefix = urlsplit(entry["urlPrefix"])._replace(scheme="http", netloc=placer_url).geturl()
    body = scheduler_body(v1_pod(REAL_TIME), ["gpu-a", "gpu-c"], entry["nodeCacheCapable"])
    for verb in (entry["filterVerb"], entry["prioritizeVerb"]):
        url = prefix.rstrip("/") + "/" + verb
        reply = requests.post(
            url, data=body, headers={"Content-Type": "application/json"}, timeout=10
        )
        assert reply.status_code == 200, (url, reply.text)
    filtered = requests.post(
        prefix.rstrip("/") + "/" + entry["filterVerb"],
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=10,
    ).json()
    assert filtered["NodeNames"] == ["gpu-a"] and filtered["FailedNodes"] == {}
    assert set(filtered["FailedAndUnresolvableNodes"]) == {"gpu-c"}


# --- the placer's manifest --------------------------------------------------------------


def test_the_placers_objects_match_the_apis_schema() -> None:
    pytest.importorskip("kubernetes")
    from kubernetes import client
    from kubernetes.client import ApiClient

    models = {
        "ServiceAccount": client.V1ServiceAccount, "Secret": client.V1Secret,
        "Deployment": client.V1Deployment, "Service": client.V1Service,
    }  # fmt: skip
    objects = placer_objects()
    assert set(objects) == set(models)
    for kind, document in objects.items():
        back = ApiClient().sanitize_for_serialization(models[kind].from_dict(document))
        assert back == document, kind
        assert document["metadata"]["namespace"] == "gpuguard"
    kustomization = yaml.safe_load((SCHEDULER / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["placer.yaml"]  # the scheduler's file is no object


def test_the_placer_runs_unprivileged_with_no_api_access() -> None:
    spec = placer_objects()["Deployment"]["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert not spec.get("hostNetwork") and not spec.get("hostPID")
    [main] = spec["containers"]
    context = main["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "tcpSocket" in main["readinessProbe"]  # the kubelet has no client certificate


def test_the_placer_starts_with_its_shipped_args_and_web_config(pki: Pki, tmp_path: Path) -> None:
    """The Deployment's args and the Secret's web config, as the placer validates them at
    start-up (the files it names replaced by a test PKI's)."""
    from gpuguard.cli import build_parser
    from gpuguard.placer.config import load_config

    objects = placer_objects()
    args = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    args = [re.sub(r"\$\((\w+)\)", "10.0.0.1", a) for a in args]
    assert_parses(args, "Deployment gpuguard-placer")
    shipped = yaml.safe_load(objects["Secret"]["stringData"]["placer.yml"])
    tls = shipped["tls_server_config"]
    assert tls["client_auth_type"] == "RequireAndVerifyClientCert"
    assert "basic_auth_users" not in shipped
    tls.update(cert_file=str(pki.server_cert), key_file=str(pki.server_key),
               client_ca_file=str(pki.ca))  # fmt: skip
    web = tmp_path / "placer.yml"
    web.write_text(yaml.safe_dump(shipped))
    parse_web_config(shipped, web)  # every key known and valid
    local = [a for a in args if not a.startswith("--web.config.file=")]
    config = load_config(build_parser().parse_args([*local, f"--web.config.file={web}"]))
    assert config.extender and config.extender_needs_certificates and config.token is None
