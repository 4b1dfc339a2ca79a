"""A PodMonitor as the Prometheus Operator turns it into a scrape job, and a pod as
Prometheus' Kubernetes discovery (role ``pod``) turns it into targets.

No API server runs here, and Debian's Prometheus is built without Kubernetes discovery, so
the job reads its targets from a file (``file_sd_configs``) holding the target groups the
discovery would make. Both halves follow the upstream sources for what
deploy/kubernetes/tenants.yaml uses: the operator's ``generatePodMonitorConfig``
(``pkg/prometheus/promcfg.go``: the job's name, the running-pods filter, a ``keep`` per
selector expression, ``namespace``/``container``/``pod``/``job`` from the pod, then the
monitor's own relabelings) and Prometheus' ``buildPod`` (``discovery/kubernetes/pod.go``: a
target per declared port of each container, one per container that declares none, init
containers too, each with its container's name, id and init flag; the pod's labels as
``__meta_kubernetes_pod_label_<name>`` and ``..._labelpresent_<name>``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_META = "__meta_kubernetes_"
_RELABEL_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def sanitize(name: str) -> str:
    """Prometheus' ``strutil.SanitizeLabelName``: anything outside ``[a-zA-Z0-9_]`` is ``_``."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def relabel_configs(relabelings: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The operator's RelabelConfig fields in Prometheus' spelling (action lower case)."""
    out = []
    for item in relabelings:
        rule = {_RELABEL_KEYS.get(key, key): value for key, value in item.items()}
        if "action" in rule:
            rule["action"] = str(rule["action"]).lower()
        out.append(rule)
    return out


def scrape_config(
    monitor: Mapping[str, Any], endpoint: int, sd_files: list[str], interval: str | None = None
) -> dict[str, Any]:
    """The scrape job for ``podMetricsEndpoints[endpoint]``, discovering from ``sd_files``.
    Only what the shipped monitor uses is rendered; anything else raises."""
    meta, spec = monitor["metadata"], monitor["spec"]
    known_spec = {"namespaceSelector", "selector", "podMetricsEndpoints"}
    known_endpoint = {"path", "interval", "relabelings", "metricRelabelings"}
    ep = spec["podMetricsEndpoints"][endpoint]
    unknown = (set(spec) - known_spec) | (set(ep) - known_endpoint)
    unknown |= set(spec["selector"]) - {"matchExpressions"}
    if unknown:
        raise ValueError(f"not rendered here: {sorted(unknown)}")
    relabel: list[dict[str, Any]] = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        {"action": "drop", "source_labels": [f"{_META}pod_phase"], "regex": "(Failed|Succeeded)"},
    ]
    for expression in spec["selector"]["matchExpressions"]:
        if expression["operator"] != "Exists":
            raise ValueError(f"not rendered here: operator {expression['operator']}")
        present = f"{_META}pod_labelpresent_{sanitize(expression['key'])}"
        relabel.append({"action": "keep", "source_labels": [present], "regex": "true"})
    relabel += [
        {"source_labels": [f"{_META}namespace"], "target_label": "namespace"},
        {"source_labels": [f"{_META}pod_container_name"], "target_label": "container"},
        {"source_labels": [f"{_META}pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
    ]
    relabel += relabel_configs(ep.get("relabelings", []))
    return {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{endpoint}",
        "honor_labels": False,
        "file_sd_configs": [{"files": sd_files, "refresh_interval": "1s"}],
        "scrape_interval": interval or ep.get("interval", "30s"),
        "metrics_path": ep.get("path", "/metrics"),
        "relabel_configs": relabel,
        "metric_relabel_configs": relabel_configs(ep.get("metricRelabelings", [])),
    }


def pod_targets(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``buildPod`` for one pod (a V1Pod as a dict): its target groups in file_sd's form,
    one group per target (file_sd labels a whole group alike)."""
    meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
    ip = status.get("podIP", "")
    if not ip:
        return []
    common = {
        f"{_META}namespace": meta["namespace"],
        f"{_META}pod_name": meta["name"],
        f"{_META}pod_ip": ip,
        f"{_META}pod_uid": meta["uid"],
        f"{_META}pod_phase": status.get("phase", "Running"),
        f"{_META}pod_ready": "true",
        f"{_META}pod_node_name": spec.get("nodeName", ""),
    }
    for key, value in meta.get("labels", {}).items():
        common[f"{_META}pod_label_{sanitize(key)}"] = value
        common[f"{_META}pod_labelpresent_{sanitize(key)}"] = "true"
    groups = []
    for init, key in ((False, "containers"), (True, "initContainers")):
        statuses = status.get("initContainerStatuses" if init else "containerStatuses", [])
        ids = {s["name"]: s.get("containerID", "") for s in statuses}
        for container in spec.get(key, []):
            labels = {
                f"{_META}pod_container_name": container["name"],
                f"{_META}pod_container_id": ids.get(container["name"], ""),
                f"{_META}pod_container_image": container.get("image", ""),
                f"{_META}pod_container_init": "true" if init else "false",
            }
            ports = container.get("ports", [])
            if not ports:
                groups.append({"targets": [_host(ip)], "labels": {**common, **labels}})
            for port in ports:
                number = str(port["containerPort"])
                groups.append({
                    "targets": [f"{_host(ip)}:{number}"],
                    "labels": {**common, **labels,
                               f"{_META}pod_container_port_number": number,
                               f"{_META}pod_container_port_name": port.get("name", ""),
                               f"{_META}pod_container_port_protocol": port.get("protocol", "TCP")},
                })  # fmt: skip
    return groups


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip
