"""The webhook endpoint's status codes and the read-only endpoints, over real HTTP.

The actuator runs in-process against a Docker socket and an exporter that do not exist:
everything that needs neither is exercised for real, and what needs them must answer 503.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuguard.actuator.controller import Controller
from gpuguard.actuator.http import ActuatorServer
from gpuguard.actuator.safety.journal import PausedEntry
from tests.unit.actuator_support import make_controller

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"
REPO = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-for-tests"


@pytest.fixture
def actuator(tmp_path: Path) -> Iterator[tuple[str, Controller]]:
    controller = make_controller(tmp_path)
    config = controller.config
    server = ActuatorServer(("127.0.0.1", 0), controller, config.token)
    server.serve_in_thread()
    yield f"http://127.0.0.1:{server.server_address[1]}", controller
    server.shutdown()
    server.server_close()
    controller.audit.close()


def post(
    url: str, body: bytes, token: str | None = TOKEN, ctype: str = "application/json"
) -> requests.Response:
    headers = {"Content-Type": ctype}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return requests.post(url + "/api/v1/alerts", data=body, headers=headers, timeout=10)


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def only(name: str, keep: str) -> bytes:
    doc = json.loads(fixture(name))
    doc["alerts"] = [a for a in doc["alerts"] if a["labels"]["alertname"] == keep]
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("token", "ctype", "body", "code"),
    [
        (None, "application/json", "firing.json", 401),
        ("wrong", "application/json", "firing.json", 401),
        (TOKEN, "text/plain", "firing.json", 415),
        (TOKEN, "application/json", "not_json.txt", 415),
        (TOKEN, "application/json", "wrong_version.json", 400),
        (TOKEN, "application/json", "malformed_missing_fingerprint.json", 400),
        (TOKEN, "application/json", "malformed_types.json", 400),
        (TOKEN, "application/json; charset=utf-8", "irrelevant.json", 200),
    ],
)
def test_status_codes(
    actuator: tuple[str, Controller], token: str | None, ctype: str, body: str, code: int
) -> None:
    url, _ = actuator
    reply = post(url, fixture(body), token, ctype)
    assert reply.status_code == code, reply.text
    assert "error" in reply.json() or code == 200


def test_wrong_auth_scheme_is_refused(actuator: tuple[str, Controller]) -> None:
    url, _ = actuator
    reply = requests.post(
        url + "/api/v1/alerts",
        data=fixture("irrelevant.json"),
        headers={"Content-Type": "application/json", "Authorization": f"Basic {TOKEN}"},
        timeout=5,
    )
    assert reply.status_code == 401 and reply.headers["WWW-Authenticate"] == "Bearer"


def test_irrelevant_alert_is_skipped_and_counted(actuator: tuple[str, Controller]) -> None:
    url, controller = actuator
    reply = post(url, fixture("irrelevant.json"))
    assert reply.json()["skips"] == [{"reason": "irrelevant_alert", "alert": "SomebodyElsesAlert"}]
    registry = controller.metrics.registry
    assert (
        registry.get_sample_value("gpuguard_actuator_skipped_total", {"reason": "irrelevant_alert"})
        == 1
    )
    assert registry.get_sample_value("gpuguard_actuator_webhooks_total", {"code": "200"}) == 1


def test_admission_without_fresh_state_is_a_503(actuator: tuple[str, Controller]) -> None:
    url, controller = actuator
    reply = post(url, only("firing.json", "GpuguardGpuSaturatedContention"))
    assert reply.status_code == 503
    assert controller.metrics.registry.get_sample_value("gpuguard_actuator_exporter_up") == 0


def test_mark_node_without_a_swarm_keeps_the_node_list(actuator: tuple[str, Controller]) -> None:
    url, controller = actuator
    reply = post(url, only("firing.json", "GpuguardNodeCannotGuaranteeDeadlines"))
    assert reply.status_code == 200, reply.text
    assert reply.json()["actions"] == [
        {"action": "mark_node", "node": "host-a", "result": "skipped"}
    ]
    nodes = requests.get(url + "/api/v1/nodes", timeout=5).json()
    assert nodes["executor"] == "list_only" and "not in a swarm" in nodes["note"]
    assert nodes["nodes"][0]["provisionable"] is False
    assert nodes["nodes"][0]["reasons"][0]["alertname"] == "GpuguardNodeCannotGuaranteeDeadlines"
    registry = controller.metrics.registry
    assert (
        registry.get_sample_value("gpuguard_actuator_node_provisionable", {"node": "host-a"}) == 0
    )
    post(url, fixture("resolved.json"))
    assert requests.get(url + "/api/v1/nodes", timeout=5).json()["nodes"][0]["provisionable"]
    assert (
        registry.get_sample_value("gpuguard_actuator_node_provisionable", {"node": "host-a"}) == 1
    )
    # the audit says when, and why: what the demo's report lists as the node's marks
    audit = [json.loads(line) for line in (controller.config.state_dir / "audit.jsonl").open()]
    marks = [(r["action"], r.get("reasons")) for r in audit if r["event"] == "action"]
    assert marks == [
        ("mark_node", ["GpuguardNodeCannotGuaranteeDeadlines"]),
        ("unmark_node", None),
    ]


def test_resume_all_with_nothing_paused_is_fine(actuator: tuple[str, Controller]) -> None:
    url, _ = actuator
    doc = json.loads(fixture("irrelevant.json"))
    doc["alerts"][0]["labels"]["alertname"] = "GpuguardExporterDown"
    assert post(url, json.dumps(doc).encode()).status_code == 200


def test_read_only_endpoints(actuator: tuple[str, Controller]) -> None:
    url, _ = actuator
    assert requests.get(url + "/healthz", timeout=5).text == "ok\n"
    metrics = requests.get(url + "/metrics", timeout=5).text
    for line in (
        'gpuguard_actuator_actions_total{action="pause",result="dry_run"} 0.0',
        'gpuguard_actuator_actions_total{action="unmark_node",result="failed"} 0.0',
        'gpuguard_actuator_skipped_total{reason="stale_state"} 0.0',
        'gpuguard_actuator_decision_seconds_count{trigger="reconcile"} 0.0',
        'gpuguard_actuator_webhooks_total{code="415"} 0.0',
        'gpuguard_actuator_node_provisionable{node="host-a"} 1.0',
        "gpuguard_actuator_paused_containers 0.0",
        "gpuguard_actuator_fail_open_total 0.0",
        'gpuguard_actuator_decision_seconds_bucket{le="0.001",trigger="reconcile"} 0.0',
    ):
        assert line in metrics, line
    # prometheus_client's creation times: ~50 series nothing reads
    assert "_created" not in metrics
    assert requests.get(url + "/nope", timeout=5).status_code == 404


def test_audit_log_records_webhook_side_effects(actuator: tuple[str, Controller]) -> None:
    url, controller = actuator
    doc: Any = json.loads(fixture("irrelevant.json"))
    doc["alerts"][0]["labels"]["alertname"] = "GpuguardTaskDeadlineOverrun"
    post(url, json.dumps(doc).encode())
    lines = (controller.config.state_dir / "audit.jsonl").read_text().splitlines()
    assert any(json.loads(line).get("alertname") == "GpuguardTaskDeadlineOverrun" for line in lines)


def test_unreachable_exporter_fails_open_once(actuator: tuple[str, Controller]) -> None:
    _, controller = actuator
    controller.journal.will_pause(PausedEntry("c" * 64, "held", "t", 0, time.time(), "newcomer"))
    controller.fail_open.last_exporter_ok -= 10  # the exporter has not answered for 10 s
    controller.maintain()
    controller.maintain()
    registry = controller.metrics.registry
    assert registry.get_sample_value("gpuguard_actuator_fail_open_total") == 1
    records = [
        json.loads(line)
        for line in (controller.config.state_dir / "audit.jsonl").read_text().splitlines()
    ]
    resume = [r for r in records if r["event"] == "resume_all"]
    assert resume and resume[0]["containers"] == ["c" * 64]
    assert "exporter unreachable" in resume[0]["why"]


def test_node_list_does_not_ask_docker_on_every_request(actuator: tuple[str, Controller]) -> None:
    url, controller = actuator
    assert controller.marks.marker is not None
    asked: list[int] = []
    node_id = controller.marks.marker.node_id
    controller.marks.marker.node_id = lambda: asked.append(1) or node_id()  # type: ignore[method-assign]
    with requests.Session() as session:
        for _ in range(50):
            assert session.get(url + "/api/v1/nodes", timeout=5).status_code == 200
    assert len(asked) <= 1


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"[" * 5000 + b"]" * 5000, "nests too deeply"),
        (fixture("firing.json").replace(b'"gpu": "0"', '"gpu": "²"'.encode()), "labels.gpu"),
        (fixture("firing.json").replace(b'"gpu": "0"', b'"gpu": "' + b"7" * 5000 + b'"'), "gpu"),
        (
            fixture("firing.json").replace(
                b'"startsAt": "2025-11-22T01:02:03.123456789Z"',
                b'"startsAt": "9999-12-31T23:59:59-23:59"',
            ),
            "startsAt",
        ),
    ],
)
def test_authenticated_bad_inputs_get_a_400(
    actuator: tuple[str, Controller], body: bytes, why: str
) -> None:
    url, controller = actuator
    reply = post(url, body)
    assert reply.status_code == 400 and why in reply.json()["error"], reply.text
    registry = controller.metrics.registry
    assert registry.get_sample_value("gpuguard_actuator_webhooks_total", {"code": "400"}) == 1


def test_oversized_webhook_is_a_413_before_its_body(actuator: tuple[str, Controller]) -> None:
    url, controller = actuator
    reply = post(url, b"x" * (4 * 1024 * 1024 + 1))
    assert reply.status_code == 413
    registry = controller.metrics.registry
    assert registry.get_sample_value("gpuguard_actuator_webhooks_total", {"code": "413"}) == 1


def test_landing_page_gzip_and_process_metrics(actuator: tuple[str, Controller]) -> None:
    url, _ = actuator
    page = requests.get(url + "/", timeout=5)
    assert page.status_code == 200 and 'href="/api/v1/nodes"' in page.text
    metrics = requests.get(url + "/metrics", headers={"Accept-Encoding": "gzip"}, timeout=5)
    assert metrics.headers["Content-Encoding"] == "gzip"
    assert "\nprocess_cpu_seconds_total " in metrics.text  # requests decompressed it
