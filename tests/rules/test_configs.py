"""The deploy configs as shipped and as rendered by gpuguard.demo.stack: ``promtool check config``
and ``amtool check-config`` accept them, and rendering keeps everything on 127.0.0.1.

Without promtool or amtool (Debian's prometheus / prometheus-alertmanager, which ``make setup``
installs): fail under ``CI=true``, skip elsewhere with the reason (``tests/prereq.py``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.deployconfig import (
    ALERTMANAGER_CONFIG,
    PROFILES,
    PROMETHEUS_DEPLOY_DIR,
    render_alertmanager_config,
    render_prometheus_config,
)
from tests.prereq import require_binary

ACTIONS = Path(__file__).resolve().parents[2] / "rules" / "actions.yml"


def check(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_shipped_prometheus_config_is_valid(profile: str) -> None:
    shipped = PROMETHEUS_DEPLOY_DIR / PROFILES[profile]
    check([require_binary("promtool"), "check", "config", str(shipped)])


def test_profiles_intervals() -> None:
    default = yaml.safe_load((PROMETHEUS_DEPLOY_DIR / "prometheus.yml").read_text())["global"]
    fast = yaml.safe_load((PROMETHEUS_DEPLOY_DIR / "prometheus-fast.yml").read_text())["global"]
    assert (default["scrape_interval"], default["evaluation_interval"]) == ("15s", "15s")
    assert (fast["scrape_interval"], fast["evaluation_interval"]) == ("1s", "1s")


def test_rendered_prometheus_config_is_valid(tmp_path: Path) -> None:
    text = render_prometheus_config(
        profile="fast",
        exporters={"127.0.0.1:19835": "node-a", "127.0.0.1:29835": "node-b"},
        actuators=["127.0.0.1:19836"],
        alertmanagers=["127.0.0.1:19093"],
    )
    config = yaml.safe_load(text)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["gpuguard-exporter"]["honor_labels"] is True
    assert jobs["gpuguard-exporter"]["static_configs"] == [
        {"targets": ["127.0.0.1:19835"], "labels": {"node": "node-a"}},
        {"targets": ["127.0.0.1:29835"], "labels": {"node": "node-b"}},
    ]
    assert jobs["gpuguard-actuator"]["static_configs"] == [{"targets": ["127.0.0.1:19836"]}]
    [manager] = config["alerting"]["alertmanagers"]
    assert manager["static_configs"] == [{"targets": ["127.0.0.1:19093"]}]
    # rule_files are absolute so the rendered file works from any directory
    assert all(Path(pattern).is_absolute() for pattern in config["rule_files"])
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    check([require_binary("promtool"), "check", "config", str(path)])


def test_rendering_drops_jobs_without_targets() -> None:
    config = yaml.safe_load(render_prometheus_config(actuators=[], alertmanagers=[]))
    assert [job["job_name"] for job in config["scrape_configs"]] == ["gpuguard-exporter"]
    assert "alerting" not in config


def test_shipped_alertmanager_config_is_valid() -> None:
    check([require_binary("amtool"), "check-config", str(ALERTMANAGER_CONFIG)])


def actuator_route(config: dict[str, Any], matcher: str) -> dict[str, Any]:
    [route] = [sub for sub in config["route"]["routes"] if sub["matchers"] == [matcher]]
    return route


def test_alertmanager_routes() -> None:
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    route = config["route"]
    assert set(route["group_by"]) == {"alertname", "node", "gpu"}
    # The actuator's routes match on gpuguard_action, never on alertname or severity.
    admission = actuator_route(config, 'gpuguard_action="admission"')
    assert (admission["group_wait"], admission["group_interval"]) == ("0s", "1s")
    node_list = actuator_route(config, 'gpuguard_action=~"mark_node|protect_slo"')
    assert (node_list["group_wait"], node_list["group_interval"]) == ("0s", "1s")
    actions = set(yaml.safe_load(ACTIONS.read_text())["actions"].values())
    routed = {
        action
        for sub in route["routes"]
        for matcher in sub["matchers"]
        if matcher.startswith("gpuguard_action")
        for action in matcher.split('"')[1].split("|")
    }
    assert routed == actions
    assert all(
        sub.get("continue") for sub in route["routes"] if sub["receiver"] != "gpuguard-operators"
    )
    receivers = {r["name"]: r for r in config["receivers"]}
    assert set(receivers) == {"gpuguard-actuator", "gpuguard-operators"}
    [webhook] = receivers["gpuguard-actuator"]["webhook_configs"]
    assert webhook["url"] == "http://127.0.0.1:10836/api/v1/alerts"
    assert webhook["send_resolved"] is True
    assert webhook["http_config"]["authorization"]["type"] == "Bearer"


def test_rendered_alertmanager_config_is_valid(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    text = render_alertmanager_config("http://127.0.0.1:19836/api/v1/alerts", token)
    config = yaml.safe_load(text)
    [actuator] = [r for r in config["receivers"] if r["name"] == "gpuguard-actuator"]
    [webhook] = actuator["webhook_configs"]
    assert webhook["url"] == "http://127.0.0.1:19836/api/v1/alerts"
    assert webhook["http_config"]["authorization"] == {
        "type": "Bearer",
        "credentials_file": str(token.resolve()),
    }
    assert config["route"] == yaml.safe_load(ALERTMANAGER_CONFIG.read_text())["route"]
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    check([require_binary("amtool"), "check-config", str(path)])


def route_receiver(config_file: Path, *labels: str) -> str:
    amtool = require_binary("amtool")
    result = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={config_file}", *labels],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


def test_per_node_routing(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    text = render_alertmanager_config(
        "http://127.0.0.1:10836/api/v1/alerts",
        token,
        node_webhooks={
            "node-a": "http://127.0.0.1:19836/api/v1/alerts",
            "node-b": "http://127.0.0.1:29836/api/v1/alerts",
        },
    )
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    check([require_binary("amtool"), "check-config", str(path)])
    assert route_receiver(
        path, "alertname=GpuguardTaskDeadlineOverrun", "gpuguard_action=record", "node=node-a"
    ) == ("gpuguard-actuator-node-a")
    assert route_receiver(
        path, "alertname=GpuguardGpuSaturatedContention", "gpuguard_action=admission", "node=node-b"
    ) == ("gpuguard-actuator-node-b")
    assert route_receiver(path, "alertname=GpuguardExporterDown") == "gpuguard-actuator"
    config = yaml.safe_load(text)
    assert route_receiver(
        path,
        "alertname=GpuguardExporterDown",
        "gpuguard_action=resume_all",
        "node=node-b",
        "severity=critical",
    ) == ("gpuguard-actuator-node-b,gpuguard-operators")
    config = yaml.safe_load(text)
    node_b = next(r for r in config["route"]["routes"] if r.get("receiver", "").endswith("node-b"))
    assert node_b["routes"], "the node route lost the deployed sub-routes"
    deployed = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())["route"]["routes"]
    for sub, shipped in zip(node_b["routes"], deployed, strict=True):
        assert {k: v for k, v in sub.items() if k != "receiver"} == {
            k: v for k, v in shipped.items() if k != "receiver"
        }
    webhooks = [r for r in config["receivers"] if r.get("webhook_configs")]
    urls = {r["name"]: r["webhook_configs"][0]["url"] for r in webhooks}
    assert urls["gpuguard-actuator-node-b"] == "http://127.0.0.1:29836/api/v1/alerts"
    assert all(
        r["webhook_configs"][0]["http_config"]["authorization"]["credentials_file"]
        == str(token.resolve())
        for r in webhooks
    )


def alert_labels() -> dict[str, dict[str, str]]:
    return {
        rule["alert"]: rule["labels"]
        for path in sorted((Path(__file__).resolve().parents[2] / "rules").glob("*.rules.yml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def test_shipped_routing() -> None:
    # Controller triggers (severity none) reach the actuator and nobody else; the others
    # reach the operators too. Every gpuguard alert reaches the actuator, by its
    # gpuguard_action label alone.
    for alert, labels in alert_labels().items():
        args = [f"alertname={alert}", "node=a", *(f"{k}={v}" for k, v in labels.items())]
        receivers = route_receiver(ALERTMANAGER_CONFIG, *args).split(",")
        if labels["severity"] == "none":
            assert receivers == ["gpuguard-actuator"], alert
        else:
            assert receivers == ["gpuguard-actuator", "gpuguard-operators"], alert
        # Any severity the operator's rules might give it: still the actuator's.
        for severity in ("info", "warning", "critical", "none"):
            with_severity = [*args, f"severity={severity}"]
            assert "gpuguard-actuator" in route_receiver(ALERTMANAGER_CONFIG, *with_severity)


def test_rendered_tenants_job_discovers_each_engine(tmp_path: Path) -> None:
    engines = ["unix:///run/node-a/docker.sock", "unix:///run/node-b/docker.sock"]
    text = render_prometheus_config(tenant_engines=engines, alertmanagers=[])
    config = yaml.safe_load(text)
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "gpuguard-tenants"]
    assert [sd["host"] for sd in job["docker_sd_configs"]] == engines
    for sd in job["docker_sd_configs"]:
        assert sd["filters"] == [{"name": "label", "values": ["gpuguard.slo.metric"]}]
        assert sd["host_networking_host"] == "127.0.0.1"
    # the series keep the exporter's join keys and come out under one name
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"__address__", "container_id", "container"} <= targets
    assert job["metric_relabel_configs"][-1] == {
        "target_label": "__name__",
        "replacement": "gpuguard_tenant_latency_bucket",
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    check([require_binary("promtool"), "check", "config", str(path)])


def test_slo_alerts_reach_the_actuator_at_once_and_warnings_the_operators(
    tmp_path: Path,
) -> None:
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    slo = actuator_route(config, 'gpuguard_action=~"mark_node|protect_slo"')
    assert (slo["group_wait"], slo["group_interval"]) == ("0s", "1s")
    assert route_receiver(
        ALERTMANAGER_CONFIG, "alertname=GpuguardSloAtRisk", "gpuguard_action=protect_slo",
        "severity=none",
    ) == "gpuguard-actuator"  # fmt: skip
    for name, action in (
        ("GpuguardSloViolated", "protect_slo"),
        ("GpuguardSloMetricMissing", "record"),
    ):
        assert route_receiver(
            ALERTMANAGER_CONFIG, f"alertname={name}", f"gpuguard_action={action}",
            "severity=warning",
        ) == "gpuguard-actuator,gpuguard-operators"  # fmt: skip


def https_variant(path: Path) -> dict[str, Any]:
    """The commented block between ``# https-variant-begin`` and ``-end`` in a shipped file."""
    lines = path.read_text().splitlines()
    begin = next(i for i, line in enumerate(lines) if line.strip() == "# https-variant-begin")
    end = next(i for i, line in enumerate(lines) if line.strip() == "# https-variant-end")
    block = [line.strip()[2:] if line.strip() != "#" else "" for line in lines[begin + 1 : end]]
    indent = min(len(line) - len(line.lstrip()) for line in block if line.strip())
    doc: dict[str, Any] = yaml.safe_load("\n".join(line[indent:] for line in block))
    return doc


def test_shipped_prometheus_https_variant_is_valid(tmp_path: Path) -> None:
    variant = https_variant(PROMETHEUS_DEPLOY_DIR / "prometheus.yml")
    assert variant["scheme"] == "https" and set(variant["basic_auth"]) == {
        "username", "password_file"
    }  # fmt: skip
    for name in ("ca.crt", "prometheus.crt", "prometheus.key", "prometheus.password"):
        (tmp_path / name).write_text("placeholder\n")
    tls = variant["tls_config"]
    for key in ("ca_file", "cert_file", "key_file"):
        tls[key] = str(tmp_path / Path(tls[key]).name)
    variant["basic_auth"]["password_file"] = str(tmp_path / "prometheus.password")
    text = render_prometheus_config(actuators=["127.0.0.1:19836"], scrape_http_config=variant)
    jobs = {job["job_name"]: job for job in yaml.safe_load(text)["scrape_configs"]}
    assert jobs["gpuguard-exporter"]["scheme"] == jobs["gpuguard-actuator"]["scheme"] == "https"
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    check([require_binary("promtool"), "check", "config", "--syntax-only", str(path)])


def test_shipped_alertmanager_https_variant_is_valid(tmp_path: Path) -> None:
    variant = https_variant(ALERTMANAGER_CONFIG)
    assert variant["url"].startswith("https://")
    http_config = variant["http_config"]
    assert "authorization" not in http_config  # Alertmanager takes one of the two
    (tmp_path / "ca.crt").write_text("placeholder\n")
    (tmp_path / "password").write_text("pw\n")
    http_config["tls_config"]["ca_file"] = str(tmp_path / "ca.crt")
    http_config["basic_auth"]["password_file"] = str(tmp_path / "password")
    text = render_alertmanager_config(variant["url"], None, http_config=http_config)
    webhook = yaml.safe_load(text)["receivers"][1]["webhook_configs"][0]
    assert webhook["url"] == variant["url"] and webhook["http_config"] == http_config
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    check([require_binary("amtool"), "check-config", str(path)])
