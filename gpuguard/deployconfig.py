"""gpuguard's Prometheus and Alertmanager configs (``deploy/prometheus/``,
``deploy/alertmanager/``) rendered with other targets, ports and credentials.

The shipped files are the one source of gpuguard's Prometheus setup: the demo, the tests and
the benchmarks (``gpuguard/demo/stack/``) and ``deploy/compose/gen_tls.py`` render them here
instead of keeping copies. Pure: files in, YAML text out.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuguard import loader, resources

ALERTMANAGER_CONFIG = resources.ALERTMANAGER_DIR / "alertmanager.yml"
PROMETHEUS_DEPLOY_DIR = resources.PROMETHEUS_DIR
PROFILES = {"default": "prometheus.yml", "fast": "prometheus-fast.yml"}
EXPORTER_JOB = "gpuguard-exporter"
ACTUATOR_JOB = "gpuguard-actuator"
GUARD_JOB = "gpuguard-guard"
#: tenants' own latency histograms, discovered through Docker (their SLOs)
TENANTS_JOB = "gpuguard-tenants"

# A list of "host:port" targets, or a mapping "host:port" -> node name; the node name becomes
# the target label `node`, so the `up` series of an exporter says which node it serves.
Targets = Sequence[str] | Mapping[str, str]


def render_prometheus_config(
    *,
    profile: str = "fast",
    exporters: Targets = ("127.0.0.1:10835",),
    actuators: Targets = ("127.0.0.1:10836",),
    alertmanagers: Sequence[str] = ("127.0.0.1:9093",),
    rule_files: Sequence[Path] | None = None,
    external_labels: Mapping[str, str] | None = None,
    deploy_dir: Path = PROMETHEUS_DEPLOY_DIR,
    guards: Targets = (),
    tenant_engines: Sequence[str] = (),
    scrape_http_config: Mapping[str, Any] | None = None,
) -> str:
    """The profile's config file with these targets; rule file paths made absolute.

    An empty target list drops that job (or, for ``alertmanagers``, the alerting section);
    the guards' job is dropped unless ``guards`` are given (a stack without guards would
    otherwise raise ``GpuguardGuardMissing``).
    ``external_labels`` (e.g. ``grafana_url``, which the alerts' links use) are added.
    ``tenant_engines``: Docker engine URLs (``unix:///.../docker.sock``) whose containers
    the tenants' job discovers, one ``docker_sd_configs`` entry each; none drops the job.
    ``scrape_http_config`` (``scheme``, ``tls_config``, ``basic_auth``: the commented https
    variant in the deploy file) goes into the exporters' and actuators' jobs, for gpuguard
    servers behind ``--web.config.file`` (the guard, loopback only, has none).
    """
    try:
        source = deploy_dir / PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(PROFILES)}") from None
    config: dict[str, Any] = loader.read_yaml(source, "Prometheus config")
    if external_labels:
        config["global"]["external_labels"] = dict(external_labels)
    if rule_files is None:
        config["rule_files"] = [
            str((source.parent / pattern).resolve()) for pattern in config.get("rule_files", [])
        ]
    else:
        config["rule_files"] = [str(Path(path).resolve()) for path in rule_files]
    jobs = {EXPORTER_JOB: exporters, ACTUATOR_JOB: actuators, GUARD_JOB: guards}
    scrape_configs = []
    for job in config.get("scrape_configs", []):
        if job["job_name"] == TENANTS_JOB:
            if tenant_engines:
                template = job["docker_sd_configs"][0]
                job["docker_sd_configs"] = [
                    {**copy.deepcopy(template), "host": url} for url in tenant_engines
                ]
                scrape_configs.append(job)
            continue
        targets = jobs.get(job["job_name"])
        if targets is not None:
            if not targets:
                continue
            job["static_configs"] = _static_configs(targets)
            if job["job_name"] != GUARD_JOB:  # the guard has no web config
                job.update(copy.deepcopy(dict(scrape_http_config or {})))
        scrape_configs.append(job)
    wanted = set(jobs) | ({TENANTS_JOB} if tenant_engines else set())
    missing = wanted - {job["job_name"] for job in config.get("scrape_configs", [])}
    if missing:
        raise ValueError(f"{source} lacks the scrape jobs {sorted(missing)}")
    config["scrape_configs"] = scrape_configs
    if alertmanagers:
        manager = copy.deepcopy(config["alerting"]["alertmanagers"][0])
        manager["static_configs"] = [{"targets": list(alertmanagers)}]
        config["alerting"]["alertmanagers"] = [manager]
    else:
        config.pop("alerting", None)
    return yaml.safe_dump(config, sort_keys=False)


def _static_configs(targets: Targets) -> list[dict[str, Any]]:
    if isinstance(targets, Mapping):
        return [
            {"targets": [address], "labels": {"node": node}} for address, node in targets.items()
        ]
    return [{"targets": list(targets)}]


def render_alertmanager_config(
    webhook_url: str,
    token_file: Path | None,
    source: Path = ALERTMANAGER_CONFIG,
    node_webhooks: Mapping[str, str] | None = None,
    http_config: Mapping[str, Any] | None = None,
) -> str:
    """The deploy config with every webhook pointed at ``webhook_url``, bearer token from
    ``token_file``; routes, timings and inhibitions stay as deployed.

    ``http_config`` (e.g. ``tls_config`` and ``basic_auth`` for an actuator behind
    ``--web.config.file``) replaces the webhooks' ``http_config`` and the token.

    ``node_webhooks`` (node name -> that node's actuator URL) adds one route per node in
    front, each with the deployed sub-routes (the admission timing), as the multi-node
    example in the deploy file describes; alerts without a known node still go to
    ``webhook_url``.
    """
    config: dict[str, Any] = loader.read_yaml(source, "Alertmanager config")
    webhooks = [
        webhook
        for receiver in config.get("receivers", [])
        for webhook in receiver.get("webhook_configs", [])
    ]
    if not webhooks:
        raise ValueError(f"{source} has no webhook receiver to point at the actuator")
    for webhook in webhooks:
        webhook["url"] = webhook_url
        if http_config is not None:
            webhook["http_config"] = copy.deepcopy(dict(http_config))
            continue
        if token_file is None:
            raise ValueError("a token file or an http_config is needed")
        webhook.setdefault("http_config", {})["authorization"] = {
            "type": "Bearer",
            "credentials_file": str(Path(token_file).resolve()),
        }
    if node_webhooks:
        _add_node_routes(config, node_webhooks)
    return yaml.safe_dump(config, sort_keys=False)


def _add_node_routes(config: dict[str, Any], node_webhooks: Mapping[str, str]) -> None:
    route = config["route"]
    template = next(r for r in config["receivers"] if r["name"] == route["receiver"])
    node_routes = []
    for node, url in node_webhooks.items():
        receiver = copy.deepcopy(template)
        receiver["name"] = f"{template['name']}-{node}"
        for webhook in receiver["webhook_configs"]:
            webhook["url"] = url
        config["receivers"].append(receiver)
        # The actuator's sub-routes go to this node's actuator; others (the operators'
        # receiver) stay as they are.
        sub_routes = [
            {
                **copy.deepcopy(sub),
                "receiver": receiver["name"]
                if sub.get("receiver", template["name"]) == template["name"]
                else sub["receiver"],
            }
            for sub in route.get("routes", [])
        ]
        # json.dumps quotes the node name the way Alertmanager's matcher syntax expects.
        node_route: dict[str, Any] = {
            "matchers": [f"node={json.dumps(node)}"],
            "receiver": receiver["name"],
        }
        if sub_routes:
            node_route["routes"] = sub_routes
        node_routes.append(node_route)
    route["routes"] = node_routes + route.get("routes", [])
