"""The real alert pipeline: a metrics endpoint -> Prometheus (fast profile, gpuguard's rules)
-> Alertmanager (gpuguard's routes) -> a webhook receiver standing in for the actuator.

The endpoint serves hand-written gpuguard_* metrics, so this needs no exporter, Docker or GPU;
it checks the deploy configs and rules end to end and measures how long a metric change takes
to reach the webhook (the design's target is <= 3 s; the test only guards < 10 s).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuguard.demo.stack.alertmanager import AlertmanagerService
from gpuguard.demo.stack.prometheus import PrometheusService
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

NODE = "it-node"
TOKEN = "it-secret-token"
GRAFANA = "https://grafana.example.test"
RUNBOOKS = "https://docs.example.test/gpuguard/runbooks.md"


def exposition(utilization: float) -> str:
    """GPU 0 shared by two unpaused containers, busy ``utilization`` of the time."""
    lines = [
        "# TYPE gpuguard_gpu_info gauge",
        f'gpuguard_gpu_info{{node="{NODE}",gpu="0",uuid="GPU-it-0",name="gpusim"}} 1',
        "# TYPE gpuguard_gpu_utilization_ratio gauge",
        f'gpuguard_gpu_utilization_ratio{{node="{NODE}",gpu="0"}} {utilization}',
        "# TYPE gpuguard_gpu_memory_used_bytes gauge",
        f'gpuguard_gpu_memory_used_bytes{{node="{NODE}",gpu="0"}} 4.0e9',
        "# TYPE gpuguard_gpu_memory_total_bytes gauge",
        f'gpuguard_gpu_memory_total_bytes{{node="{NODE}",gpu="0"}} 2.4e10',
        "# TYPE gpuguard_container_gpu_processes gauge",
        "# TYPE gpuguard_container_paused gauge",
    ]
    for name, cid in (("rt-1", "aaaaaaaaaaa1"), ("rt-2", "aaaaaaaaaaa2")):
        labels = f'node="{NODE}",container="{name}",container_id="{cid}"'
        lines.append(f'gpuguard_container_gpu_processes{{{labels},gpu="0"}} 1')
        lines.append(f"gpuguard_container_paused{{{labels}}} 0")
    lines += [
        "# TYPE gpuguard_tasks_waiting gauge",
        f'gpuguard_tasks_waiting{{node="{NODE}",gpu="0"}} 0',
    ]
    return "\n".join(lines) + "\n"


@dataclass
class MetricsEndpoint:
    """The text a scrape of ``/metrics`` returns; swap it to change the metrics."""

    body: str
    port: int = 0
    changed_at: float = 0.0

    def set(self, body: str) -> None:
        self.body = body
        self.changed_at = time.monotonic()


@dataclass
class Webhook:
    """A received webhook POST: arrival time, Authorization header and JSON payload."""

    at: float
    authorization: str | None
    payload: dict[str, Any]


@dataclass
class WebhookReceiver:
    port: int = 0
    received: list[Webhook] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1/alerts"

    def wait_for(self, match: Callable[[Webhook], bool], timeout: float) -> Webhook | None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for hook in self.received:
                    if match(hook):
                        return hook
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.cond.wait(remaining)


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, int(server.server_address[1])


@pytest.fixture
def metrics_endpoint() -> Iterator[MetricsEndpoint]:
    endpoint = MetricsEndpoint(exposition(0.3))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = endpoint.body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server, endpoint.port = _serve(Handler)
    yield endpoint
    server.shutdown()
    server.server_close()


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            hook = Webhook(time.monotonic(), self.headers.get("Authorization"), json.loads(body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            with receiver.cond:
                receiver.received.append(hook)
                receiver.cond.notify_all()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server, receiver.port = _serve(Handler)
    yield receiver
    server.shutdown()
    server.server_close()


def _has_alert(name: str, status: str) -> Callable[[Webhook], bool]:
    def match(hook: Webhook) -> bool:
        return any(
            alert["labels"].get("alertname") == name and alert["status"] == status
            for alert in hook.payload.get("alerts", [])
        )

    return match


def test_saturation_alert_reaches_the_actuator_webhook(
    tmp_path: Path,
    record_property: Callable[[str, object], None],
    metrics_endpoint: MetricsEndpoint,
    webhook_receiver: WebhookReceiver,
    prometheus_factory: Callable[..., PrometheusService],
    alertmanager_factory: Callable[..., AlertmanagerService],
) -> None:
    token_file = tmp_path / "actuator.token"
    token_file.write_text(TOKEN + "\n")
    alertmanager = alertmanager_factory(webhook_receiver.url, token_file)
    prometheus = prometheus_factory(
        profile="fast",
        exporters={f"127.0.0.1:{metrics_endpoint.port}": NODE},
        actuators=[],
        alertmanagers=[alertmanager.address],
        external_labels={"grafana_url": GRAFANA, "runbook_url": RUNBOOKS},
    )

    # The rules run on scraped data: two active tasks, GPU not saturated, no alert yet.
    active = f'gpuguard:gpu_tasks_active:count{{node="{NODE}",gpu="0"}}'
    wait_for(lambda: prometheus.query_value(active) == 2.0, 30, "the recording rules")
    assert prometheus.query_value(f'up{{job="gpuguard-exporter",node="{NODE}"}}') == 1.0
    early = webhook_receiver.wait_for(_has_alert("GpuguardGpuSaturatedContention", "firing"), 0)
    assert early is None, "alert fired before the GPU was saturated"

    metrics_endpoint.set(exposition(1.0))
    hook = webhook_receiver.wait_for(_has_alert("GpuguardGpuSaturatedContention", "firing"), 20)
    assert hook is not None, "GpuguardGpuSaturatedContention never reached the webhook"
    latency = hook.at - metrics_endpoint.changed_at
    record_property("alert_delivery_s", round(latency, 3))
    print(f"\nalert pipeline: metric change -> webhook in {latency:.2f} s")

    assert hook.authorization == f"Bearer {TOKEN}"
    payload = hook.payload
    assert payload["version"] == "4"
    assert payload["status"] == "firing"
    [alert] = [
        a for a in payload["alerts"] if a["labels"]["alertname"] == "GpuguardGpuSaturatedContention"
    ]
    assert alert["labels"]["node"] == NODE
    assert alert["labels"]["gpu"] == "0"
    assert alert["labels"]["severity"] == "none"  # a trigger for the actuator, not a page
    assert alert["labels"]["gpuguard_action"] == "admission"
    # Absolute links from the Prometheus external labels.
    assert alert["annotations"]["dashboard"].startswith(f"{GRAFANA}/d/gpuguard-node/")
    assert alert["annotations"]["runbook_url"] == f"{RUNBOOKS}#gpuguardgpusaturatedcontention"
    group = {"alertname": "GpuguardGpuSaturatedContention", "node": NODE, "gpu": "0"}
    assert payload["groupLabels"] == group
    assert latency < 10.0

    # send_resolved: the actuator hears when the contention ends.
    metrics_endpoint.set(exposition(0.3))
    changed = metrics_endpoint.changed_at
    resolved = webhook_receiver.wait_for(
        _has_alert("GpuguardGpuSaturatedContention", "resolved"), 20
    )
    assert resolved is not None, "the resolution never reached the webhook"
    assert resolved.authorization == f"Bearer {TOKEN}"
    print(f"alert pipeline: resolution -> webhook in {resolved.at - changed:.2f} s")


def test_the_printed_ui_links_open(prometheus_factory: Callable[..., PrometheusService]) -> None:
    """Debian's Prometheus serves its UI under /classic/: /alerts is a 404 there."""
    prometheus = prometheus_factory(profile="fast", exporters={}, actuators=[], alertmanagers=[])
    for page in ("alerts", "targets", "graph"):
        url = prometheus.page(page)
        assert url.startswith(prometheus.url) and url.endswith(f"/{page}")
        assert requests.get(url, timeout=5).status_code == 200, url
