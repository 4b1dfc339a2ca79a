"""A latency SLO declared on a pod with a sidecar, on a Kubernetes-like node, end to end.

The pod of issue 25: a server ``vllm`` (gpusim's ``server``, serving vLLM's latency
histogram) and a ``log-shipper`` sidecar, with the SLO on the pod's labels and
``gpuguard.container=vllm`` naming the container it is for; the metric is given in its
``_`` form, a valid Kubernetes label value. The exporter follows a real private containerd
(pods made as the kubelet makes them, ``containerd_support``) and must publish one SLO, the
server's; the sidecar gets neither the SLO nor the class.

A real Prometheus then scrapes the exporter, and the server through
deploy/kubernetes/tenants.yaml as the Prometheus Operator renders it, over the targets its
Kubernetes discovery would make for this pod (``tests/support/podmonitor.py``: no API server
runs here, and Debian's Prometheus has no Kubernetes discovery, so they come from a file).
Only the server's target is kept, its series carry the exporter's ``container_id``, the SLO
rules record one attainment, and the condition of ``GpuguardSloMetricMissing`` holds for no
container (its two minutes are promtool's to check: tests/rules/alerts_slo_test.yml).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from containerd_support import Pod
from exporter_support import ExporterProcess
from prometheus_client.parser import text_string_to_metric_families

from gpuguard import labels, resources
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.process import free_port
from gpuguard.demo.stack.prometheus import PrometheusService
from tests.support.podmonitor import pod_targets, scrape_config
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
METRIC = "vllm_e2e_request_latency_seconds"  # vLLM's vllm:e2e_request_latency_seconds


@pytest.fixture
def k8s_exporter_flags(tmp_path: Path) -> tuple[str, ...]:
    """The operator grants the pods of namespace team-a what they claim (real-time, an SLO):
    the built-in default grants neither (docs/security.md). The namespace is the pod's
    sandbox's, as the CRI records it."""
    policy = tmp_path / "trust.yml"
    policy.write_text('version: 1\nrules:\n  - match: {namespace: "team-a"}\n')
    return (f"--trust.policy-file={policy}",)


def samples(text: str, name: str) -> list[dict[str, str]]:
    return [
        s.labels
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def pod_object(pod: Pod, ids: dict[str, str]) -> dict[str, Any]:
    """The pod as the API server would hold it: the server declares two ports, the sidecar
    none, and an init container ran first (its target must never be scraped)."""
    return {
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                     "labels": pod.labels},
        "spec": {
            "nodeName": "itest",
            "containers": [
                {"name": "vllm", "image": "vllm/vllm-openai",
                 "ports": [{"name": "http", "containerPort": 8000},
                           {"name": "grpc", "containerPort": 8001}]},
                {"name": "log-shipper", "image": "fluent/fluent-bit"},
            ],
            "initContainers": [{"name": "fetch-model", "image": "busybox"}],
        },
        "status": {
            "podIP": "127.0.0.1",  # stands in for the pod's address: the server is on loopback
            "phase": "Running",
            "containerStatuses": [{"name": name, "containerID": f"containerd://{cid}"}
                                  for name, cid in ids.items()],
            "initContainerStatuses": [{"name": "fetch-model",
                                       "containerID": "containerd://" + "f" * 64}],
        },
    }  # fmt: skip


def missing_condition() -> str:
    """GpuguardSloMetricMissing's expression without its two minutes' history: an SLO
    declared now whose histogram has no bucket at the target."""
    rules = yaml.safe_load((resources.RULES_DIR / "gpuguard-alerts.rules.yml").read_text())
    (expr,) = [
        rule["expr"]
        for group in rules["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "GpuguardSloMetricMissing"
    ]
    history = "(gpuguard_container_slo_info offset 2m)"
    assert history in expr
    return str(expr.replace(history, "gpuguard_container_slo_info"))


def test_a_pods_slo_is_its_servers_alone_and_measured_through_the_pod_monitor(
    k8s_exporter: ExporterProcess,
    pods: Callable[..., Pod],
    sim: GpusimService,
    prometheus_factory: Callable[..., PrometheusService],
    tmp_path: Path,
) -> None:
    port = free_port()
    pod = pods("chat", "systemd", {
        labels.CONTAINER: "vllm", labels.CLASS: "real-time", labels.SLO_METRIC: METRIC,
        labels.SLO_TARGET: "500ms", labels.SLO_OBJECTIVE: "0.9", labels.SLO_PORT: str(port),
        "app": "chat",
    })  # fmt: skip
    server = pod.run_python(
        "vllm",
        ["gpuguard.gpusim.workload", "server", "--arrivals", "fixed", "--rate", "5",
         "--duration", "120", "--request-work", "0.05", "--metrics-port", str(port),
         "--socket", str(sim.socket)],
        [str(sim.dir)],
        host_network=True,
    )  # fmt: skip
    shipper = pod.run_sleeper("log-shipper")

    def both_running() -> bool:
        states = {c["id"]: c["state"] for c in k8s_exporter.state()["containers"]}
        return states.get(server) == states.get(shipper) == "running"

    wait_for(both_running, 15, "the server and its sidecar")
    text = k8s_exporter.metrics_text()
    (slo,) = samples(text, "gpuguard_container_slo_info")
    assert (slo["container"], slo["container_id"], slo["metric"]) == ("vllm", server[:12], METRIC)
    assert (slo["namespace"], slo["pod"]) == ("team-a", "chat")
    classes = {s["container"]: s["class"] for s in samples(text, "gpuguard_container_task_info")}
    assert classes == {"vllm": "real-time", "log-shipper": "normal"}
    assert samples(text, "gpuguard_container_label_invalid") == []

    targets = tmp_path / "pods.json"
    ids = {"vllm": server, "log-shipper": shipper}
    targets.write_text(json.dumps(pod_targets(pod_object(pod, ids))))
    monitor = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "tenants.yaml").read_text())
    tenants = scrape_config(monitor, 0, [str(targets)], interval="1s")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in sorted(resources.RULES_DIR.glob("*.rules.yml"))],
        "scrape_configs": [
            {"job_name": "gpuguard-exporter", "honor_labels": True,
             "static_configs": [{"targets": [k8s_exporter.url.removeprefix("http://")]}]},
            tenants,
        ],
    }  # fmt: skip
    prometheus = prometheus_factory(config_text=yaml.safe_dump(config))

    def tenant_targets() -> list[dict[str, Any]]:
        return [t for t in prometheus.targets() if t["scrapePool"] == tenants["job_name"]]

    (target,) = wait_for(tenant_targets, 20, "the PodMonitor's targets")
    assert target["labels"] == {
        "container": "vllm", "container_id": server[:12], "instance": f"127.0.0.1:{port}",
        "job": "gpuguard/gpuguard-tenants", "namespace": "team-a", "pod": "chat",
    }  # fmt: skip
    wait_for(lambda: tenant_targets()[0]["health"] == "up", 20, "the server's scrape")

    attainment = wait_for(
        lambda: prometheus.query("gpuguard:container_slo_attainment_ratio:1m"),
        40,
        "the server's SLO attainment",
        interval=0.5,
    )
    assert [a["metric"]["container"] for a in attainment] == ["vllm"]
    assert attainment[0]["metric"]["container_id"] == server[:12]
    # the alert's condition: for no container, for the server not because of an empty join
    assert prometheus.query(missing_condition()) == []
    matched = 'gpuguard_tenant_latency_bucket and on (container_id, metric, le) label_replace(gpuguard_container_slo_bucket_info, "le", "$1", "bound", "(.+)")'  # noqa: E501
    assert {r["metric"]["container_id"] for r in prometheus.query(matched)} == {server[:12]}
