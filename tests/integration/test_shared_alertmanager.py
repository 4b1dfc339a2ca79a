"""gpuguard's triggers in a shared Alertmanager: deploy/kubernetes/alertmanagerconfig.yaml,
merged as the Prometheus Operator merges it, into kube-prometheus-stack's default
configuration (its inhibit rules, an ``InfoInhibitor`` firing in gpuguard's namespace).

A real Alertmanager gets every alert the actuator handles, for two nodes, through its v2 API;
two loopback webhook servers stand for the two nodes' actuators behind the one receiver.
Every trigger must reach both of them, with the actuator's token.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gpuguard.demo.stack.alertmanager import BINARIES, AlertmanagerService
from tests.prereq import Services, unavailable
from tests.support.alertmanagerconfig import kube_prometheus_stack_config
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
ALERTMANAGER_CONFIG = ROOT / "deploy" / "kubernetes" / "alertmanagerconfig.yaml"
TOKEN = "t0ken-for-the-test"
NODES = ("node-a", "node-b")
# gpuguard's own inhibit rule mutes admission on a node whose exporter is down or stale (by
# design): those alerts fire for a node of their own here.
HEALTH_NODE = "node-c"
HEALTH_ALERTS = {"GpuguardExporterDown", "GpuguardExporterStale"}


class Webhook:
    """A loopback HTTP server recording Alertmanager's webhook messages."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.authorizations: set[str] = set()
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                webhook.messages.append(body)
                webhook.authorizations.add(self.headers.get("Authorization", ""))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/alerts"

    def delivered(self) -> set[tuple[str, str]]:
        """(alertname, node) of every firing alert delivered so far."""
        return {
            (alert["labels"]["alertname"], alert["labels"].get("node", ""))
            for message in list(self.messages)
            for alert in message["alerts"]
            if alert["status"] == "firing"
        }


@pytest.fixture
def webhooks() -> Iterator[list[Webhook]]:
    servers = [Webhook() for _ in NODES]
    for server in servers:
        server.thread.start()
    yield servers
    for server in servers:
        server.server.shutdown()
        server.server.server_close()


def triggers() -> list[dict[str, str]]:
    """Every alert rule that carries ``gpuguard_action``, with its static labels."""
    rules = [
        rule
        for path in sorted((ROOT / "rules").glob("*.rules.yml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "gpuguard_action" in rule.get("labels", {})
    ]
    return [{"alertname": rule["alert"], **rule["labels"]} for rule in rules]


def post(alertmanager: AlertmanagerService, alerts: list[dict[str, str]]) -> None:
    now = datetime.now(UTC)
    body = [
        {
            "labels": labels,
            "annotations": {"summary": "test"},
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(minutes=10)).isoformat(),
        }
        for labels in alerts
    ]
    response = requests.post(f"{alertmanager.url}/api/v2/alerts", json=body, timeout=10)
    response.raise_for_status()


def test_every_trigger_survives_kube_prometheus_stack_defaults(
    tmp_path: Path, webhooks: list[Webhook]
) -> None:
    if not any(shutil.which(name) for name in BINARIES):
        unavailable("Alertmanager not installed (make setup installs it)")
    document = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    config = kube_prometheus_stack_config(
        document,
        {("gpuguard-actuator-token", "token"): TOKEN},
        webhook_urls=[webhook.url for webhook in webhooks],
    )
    services = Services()
    try:
        alertmanager = services.start(
            AlertmanagerService(tmp_path / "am", config_text=yaml.safe_dump(config)),
            "Alertmanager",
        )
        # The inhibitors first: kube-prometheus-stack's InfoInhibitor and a critical alert,
        # in gpuguard's namespace, plus an `info` alert there that they must mute.
        neighbours = [
            {"alertname": "InfoInhibitor", "severity": "none", "namespace": "gpuguard"},
            {"alertname": "KubePodCrashLooping", "severity": "critical", "namespace": "gpuguard"},
            {"alertname": "SomeInfo", "severity": "info", "namespace": "gpuguard"},
        ]
        post(alertmanager, neighbours)
        expected: set[tuple[str, str]] = set()
        alerts = []
        for trigger in triggers():
            nodes = (HEALTH_NODE,) if trigger["alertname"] in HEALTH_ALERTS else NODES
            for node in nodes:
                # prometheusrule.yaml gives every alert namespace=gpuguard.
                alerts.append({**trigger, "namespace": "gpuguard", "node": node, "gpu": "0"})
                expected.add((trigger["alertname"], node))
        assert {a["severity"] for a in alerts} <= {"none", "warning", "critical"}
        # The control: a trigger at severity `info`, as gpuguard used to send them.
        control = {**alerts[0], "severity": "info", "node": "node-info"}
        post(alertmanager, [*alerts, control])

        # The inhibitor is live: the `info` alerts beside gpuguard's are muted.
        def muted() -> bool:
            held = {
                (a["labels"]["alertname"], a["labels"].get("node")): a
                for a in alertmanager.alerts()
            }
            return all(
                held.get(key, {}).get("status", {}).get("inhibitedBy")
                for key in (("SomeInfo", None), (control["alertname"], "node-info"))
            )

        wait_for(muted, timeout=15, what="InfoInhibitor to mute the info alerts")
        for webhook in webhooks:
            wait_for(
                lambda w=webhook: expected <= w.delivered(),  # type: ignore[misc]
                timeout=30,
                what=f"every trigger at {webhook.url}",
            )
            assert webhook.authorizations == {f"Bearer {TOKEN}"}
            assert (control["alertname"], "node-info") not in webhook.delivered()
            names = {name for name, _ in webhook.delivered()}
            assert not names & {"InfoInhibitor", "KubePodCrashLooping", "SomeInfo"}
        held = alertmanager.alerts()
        inhibited = [
            a["labels"]["alertname"] for a in held if a["labels"].get("gpuguard_action")
            if a["status"]["inhibitedBy"] and a["labels"]["node"] != "node-info"
        ]  # fmt: skip
        assert inhibited == []
    finally:
        services.stop_all()
