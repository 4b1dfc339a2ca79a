"""The placer's API: strict queries, records from Prometheus' reply, handlers and HTTP."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuguard.contract import StateReason
from gpuguard.demo.stack.process import free_port
from gpuguard.noderecord import GpuRecord, NodeRecord
from gpuguard.placer.errors import BadRequest, RecordsUnavailable
from gpuguard.placer.http import placer_server
from gpuguard.placer.query import parse_memory, parse_query
from gpuguard.placer.ranking import NodeView, Policy
from gpuguard.placer.service import Placer, Settings
from gpuguard.placer.source import RECORDS_QUERY, views_from_samples

GIB = 2**30


# --- query ------------------------------------------------------------------------------------


def test_query_reads_every_parameter() -> None:
    q = parse_query("deadline=1500ms&memory=2GiB&runtime=0.5s&gpu_model=NVIDIA+A100&policy=paper-c")
    assert (q.request.deadline_s, q.request.memory_bytes) == (1.5, 2 * GIB)
    assert (q.request.runtime_s, q.request.gpu_model, q.policy) == (
        0.5,
        "NVIDIA A100",
        Policy.PAPER_C,
    )
    assert parse_memory("1073741824") == GIB and parse_memory("512MiB") == GIB // 2


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("memory=2GiB", "missing parameter deadline"),
        ("deadline=9s", "missing parameter memory"),
        ("deadline=9s&memory=2GiB&extra=1", "unknown parameter 'extra'"),
        ("deadline=9s&deadline=8s&memory=1", "given twice"),
        ("deadline=&memory=1", "1 to 64 ASCII"),
        ("deadline=nan&memory=1", "write digits and a unit"),
        ("deadline=inf&memory=1", "write digits and a unit"),
        ("deadline=1e3&memory=1", "write digits and a unit"),
        ("deadline=-1s&memory=1", "must be greater than zero"),
        ("deadline=0s&memory=1", "at least 10ms"),
        ("deadline=2d&memory=1", "write digits and a unit"),
        ("deadline=90000s&memory=1", "at most"),
        ("deadline=%D9%A3s&memory=1", "ASCII"),  # an Arabic-Indic digit, percent-encoded
        ("deadline=٣s&memory=1", "ASCII"),
        ("deadline=9s&memory=-1", "memory"),
        ("deadline=9s&memory=0", "more than 0"),
        ("deadline=9s&memory=2PiB", "memory"),
        ("deadline=9s&memory=99999999999999999", "memory"),
        ("deadline=9s&memory=1&policy=best", "policy 'best'"),
        ("deadline=9s&memory=1&gpu_model=%0Aevil", "gpu_model"),
        ("deadline=9s&memory=1&" + "x" * 1100, "longer than"),
        ("deadline", "malformed"),
    ],
)
def test_bad_queries_are_one_line_errors(query: str, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_query(query)


# --- records from Prometheus' reply -----------------------------------------------------------


def series(metric: str, value: str, **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": metric, **labels}, "value": [1000.0, value]}


def reply(node: str = "a", free: str = "10737418240", state: str = "1", **extra: str) -> list:
    out = [
        series("gpuguard_exporter_last_poll_timestamp_seconds", "998.5", node=node),
        series("gpuguard_gpu_info", "1", node=node, gpu="0", name="NVIDIA A100"),
        series("gpuguard_gpu_state", state, node=node, gpu="0"),
        series("gpuguard_gpu_float_time_seconds", extra.get("float", "+Inf"), node=node, gpu="0"),
        series("gpuguard_gpu_free_memory_bytes", free, node=node, gpu="0"),
        series("gpuguard_gpu_memory_total_bytes", str(24 * GIB), node=node, gpu="0"),
        series("gpuguard_gpu_busy_ratio", "0.25", node=node, gpu="0"),
        series("gpuguard_gpu_running_tasks", "2", node=node, gpu="0"),
    ]
    if state == "0":
        out.append(series("gpuguard_gpu_state_reason", "1", node=node, gpu="0", reason="saturated"))
    return out


def test_views_from_the_records_query() -> None:
    samples = [
        *reply("a"),
        *reply("b", state="0", float="12.5"),
        series("gpuguard_actuator_node_provisionable", "0", node="b"),
        series("gpuguard_actuator_node_provisionable", "1", node="c"),  # no exporter: no record
        series("gpuguard_gpu_state", "1", node="d", gpu="0"),  # no poll time: no record
        series("gpuguard_gpu_state", "1", gpu="0"),  # no node label
    ]
    views = views_from_samples(samples, now=1000.0)
    assert [v.record.node for v in views] == ["a", "b"]
    a, b = views
    assert (a.age_s, a.marked, b.marked) == (1.5, False, True)
    [ga] = a.record.gpus
    assert ga == GpuRecord(
        "0", "NVIDIA A100", 1, (), math.inf, 0, 0, 2, None, 0.25, 10 * GIB, 24 * GIB
    )
    [gb] = b.record.gpus
    assert (gb.state, gb.reasons, gb.float_time_s) == (0, (StateReason.SATURATED,), 12.5)


def test_a_gpu_without_its_core_series_is_left_out() -> None:
    samples = [s for s in reply("a") if s["metric"]["__name__"] != "gpuguard_gpu_free_memory_bytes"]
    [view] = views_from_samples(samples, now=1000.0)
    assert view.record.gpus == ()


def test_records_query_selects_the_series_and_only_holding_reasons() -> None:
    assert "gpuguard_gpu_state_reason == 1" in RECORDS_QUERY
    for name in ("state", "free_memory_bytes", "memory_total_bytes", "running_tasks", "info"):
        assert name in RECORDS_QUERY


# --- handlers ---------------------------------------------------------------------------------


class StaticSource:
    """Node views held in memory (what PrometheusSource returns), or an outage."""

    def __init__(self, views: list[NodeView] | None = None) -> None:
        self.list = views or []
        self.down = False

    def views(self) -> list[NodeView]:
        if self.down:
            raise RecordsUnavailable("prometheus at http://x: ConnectionError")
        return self.list


def record(name: str, free_gib: float, state: int = 1) -> NodeView:
    reasons = () if state else (StateReason.MEMORY_FULL,)
    gpu = GpuRecord(
        "0", "sim", state, reasons, math.inf, 0, 0, 0, None, 0.0, int(free_gib * GIB), 24 * GIB
    )
    return NodeView(NodeRecord(name, 999.0, (gpu,)), 1.0)


@pytest.fixture
def placer() -> Placer:
    source = StaticSource([record("a", 10), record("b", 20), record("c", 23, state=0)])
    return Placer(source, Settings(), clock=lambda: 1000.0)


def test_a_reservation_answers_node_gpu_and_why_and_reserves(placer: Placer) -> None:
    first = placer.reserve("deadline=9s&memory=8GiB", client="10.0.0.1")
    assert first.code == 200
    assert (first.doc["node"], first.doc["gpu"]) == ("b", "0")
    assert first.doc["why"].startswith("gpuguard: state 1, 0 task(s)")
    assert first.doc["ranked"][-1]["reasons"] == ["memory_full"]
    # b's record cannot show the first placement yet: it counts 8 GiB and one task there
    second = placer.reserve("deadline=9s&memory=8GiB", client="10.0.0.1")
    assert second.doc["node"] == "a"
    third = placer.reserve("deadline=9s&memory=8GiB", client="10.0.0.1")  # b: 12 GiB left
    assert third.doc["node"] == "b" and "1 task(s)" in third.doc["why"]
    fourth = placer.reserve("deadline=9s&memory=8GiB", client="10.0.0.1")
    assert fourth.code == 409 and fourth.doc["eligible"] == 0
    reasons = {c["node"]: c["reasons"] for c in fourth.doc["ranked"]}
    assert reasons == {"a": ["memory"], "b": ["memory"], "c": ["memory_full"]}


def test_a_placement_query_does_not_reserve(placer: Placer) -> None:
    # Issue 20, item 5: every GET reserved memory for ~10 s, so a client asking twice a
    # second without a token made 35 of 40 legitimate requests answer 409.
    for _ in range(10):
        asked = placer.placement("deadline=9s&memory=8GiB")
        assert asked.code == 200 and asked.doc["node"] == "b"
    assert len(placer.reservations) == 0


def test_reservations_are_rate_limited_per_client() -> None:
    now = [1000.0]
    source = StaticSource([record(f"n{i}", 23) for i in range(20)])
    placer = Placer(source, Settings(client_rate=1.0, client_burst=3), clock=lambda: now[0])
    codes = [placer.reserve("deadline=9s&memory=1GiB", client="a").code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    limited = placer.reserve("deadline=9s&memory=1GiB", client="a")
    assert limited.code == 429 and limited.retry_after_s == pytest.approx(1.0)
    assert placer.reserve("deadline=9s&memory=1GiB", client="b").code == 200  # its own budget
    now[0] += 1.0
    assert placer.reserve("deadline=9s&memory=1GiB", client="a").code == 200
    assert len(placer.reservations) == 5


def test_node_list_does_not_reserve(placer: Placer) -> None:
    for _ in range(3):
        listed = placer.nodes("deadline=9s&memory=8GiB")
        assert listed.code == 200 and listed.doc["ranked"][0]["node"] == "b"
    everything = placer.nodes("")
    assert everything.doc["candidates"] == 3 and everything.doc["eligible"] == 2


def test_bad_input_and_outage_answers(placer: Placer) -> None:
    assert placer.placement("deadline=soon&memory=1").code == 400
    assert placer.nodes("bogus=1").code == 400
    placer.source.down = True  # type: ignore[attr-defined]
    down = placer.placement("deadline=9s&memory=1GiB")
    assert down.code == 503 and "prometheus" in down.doc["error"]
    assert placer.metrics.records_up._value.get() == 0  # type: ignore[attr-defined]


# --- HTTP -------------------------------------------------------------------------------------


@pytest.fixture
def server(placer: Placer) -> Iterator[str]:
    port = free_port()
    srv = placer_server(("127.0.0.1", port), placer, token="s3cret")
    srv.serve_in_thread()
    yield f"http://127.0.0.1:{port}"
    srv.shutdown()
    srv.server_close()


def test_http_adapter(server: str) -> None:
    auth = {"Authorization": "Bearer s3cret"}
    url = server + "/api/v1/placement"
    ok = requests.get(url, params={"deadline": "9s", "memory": "1GiB"}, headers=auth, timeout=5)
    assert ok.status_code == 200 and ok.json()["node"] == "b"
    assert requests.get(url + "?deadline=9s&memory=1GiB", timeout=5).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert requests.get(url + "?deadline=9s&memory=1", headers=wrong, timeout=5).status_code == 401
    bad = requests.get(url + "?deadline=9s&memory=lots", headers=auth, timeout=5)
    assert bad.status_code == 400 and "memory" in bad.json()["error"]
    assert requests.put(url, headers=auth, timeout=5).status_code == 405
    assert requests.get(server + "/nope", timeout=5).status_code == 404
    assert requests.get(server + "/healthz", timeout=5).text == "ok\n"
    metrics = requests.get(server + "/metrics", timeout=5).text
    assert 'gpuguard_placer_requests_total{code="401",endpoint="placement"} 2.0' in metrics
    assert "_created" not in metrics
    listed = requests.get(server + "/api/v1/nodes", headers=auth, timeout=5).json()
    assert [c["node"] for c in listed["ranked"]] == ["b", "a", "c"]  # a query reserves nothing


def test_http_reservation_needs_the_token(server: str) -> None:
    auth = {"Authorization": "Bearer s3cret"}
    url = server + "/api/v1/placement"
    form = {"deadline": "9s", "memory": "8GiB"}
    assert requests.post(url, data=form, timeout=5).status_code == 401
    placed = requests.post(url, data=form, headers=auth, timeout=5)
    assert placed.status_code == 200 and placed.json()["node"] == "b"
    listed = requests.get(server + "/api/v1/nodes", headers=auth, timeout=5).json()
    assert listed["ranked"][0]["node"] == "a"  # b holds the reservation now
    bad = requests.post(url, data={"deadline": "9s"}, headers=auth, timeout=5)
    assert bad.status_code == 400
    as_json = requests.post(url, json=form, headers=auth, timeout=5)
    assert as_json.status_code == 415


def test_http_reservations_are_refused_without_a_token(placer: Placer) -> None:
    port = free_port()
    srv = placer_server(("127.0.0.1", port), placer, token=None)
    srv.serve_in_thread()
    try:
        url = f"http://127.0.0.1:{port}/api/v1/placement"
        refused = requests.post(url, data={"deadline": "9s", "memory": "1GiB"}, timeout=5)
        assert refused.status_code == 403 and "--web.token-file" in refused.json()["error"]
        asked = requests.get(url, params={"deadline": "9s", "memory": "1GiB"}, timeout=5)
        assert asked.status_code == 200  # a query needs no token on loopback
        assert len(placer.reservations) == 0
    finally:
        srv.shutdown()
        srv.server_close()


def test_http_reservations_are_rate_limited(placer: Placer) -> None:
    port = free_port()
    placer.settings = Settings(client_rate=0.5, client_burst=2)
    srv = placer_server(("127.0.0.1", port), placer, token="s3cret")
    srv.serve_in_thread()
    try:
        url = f"http://127.0.0.1:{port}/api/v1/placement"
        auth = {"Authorization": "Bearer s3cret"}
        form = {"deadline": "9s", "memory": "1GiB"}
        replies = [requests.post(url, data=form, headers=auth, timeout=5) for _ in range(3)]
        assert [r.status_code for r in replies] == [200, 200, 429]
        assert replies[2].headers["Retry-After"] == "2"
    finally:
        srv.shutdown()
        srv.server_close()


# --- issue 20, item 2: one bad record cannot break placement for the whole cluster ----------


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "-1", "1e40"])
@pytest.mark.parametrize(
    "field",
    ["free_memory_bytes", "memory_total_bytes", "state", "running_tasks", "busy_ratio"],
)
def test_a_gpu_whose_record_is_not_a_number_is_passed_over(field: str, bad: str) -> None:
    samples = [
        s if s["metric"]["__name__"] != f"gpuguard_gpu_{field}" else {**s, "value": [0, bad]}
        for s in reply("broken")
    ] + reply("good")
    views = views_from_samples(samples, now=1000.0)
    placer = Placer(StaticSource(views), Settings(), clock=lambda: 1000.0)
    chosen = placer.placement("deadline=9s&memory=1GiB")
    assert chosen.code == 200 and chosen.doc["node"] == "good"
    listed = placer.nodes("")
    assert listed.code == 200
    reasons = {c["node"]: c["reasons"] for c in listed.doc["ranked"]}
    assert reasons == {"good": [], "broken": ["invalid_record"]}
    assert "NaN" not in json.dumps(listed.doc) and "Infinity" not in json.dumps(listed.doc)


def test_an_unbounded_float_time_is_fine_and_a_nan_one_is_not() -> None:
    views = views_from_samples([*reply("a", float="+Inf"), *reply("b", float="NaN")], 1000.0)
    placer = Placer(StaticSource(views), Settings(), clock=lambda: 1000.0)
    reasons = {c["node"]: c["reasons"] for c in placer.nodes("").doc["ranked"]}
    assert reasons == {"a": [], "b": ["invalid_record"]}


@pytest.mark.parametrize(
    "sample",
    [
        {"metric": {"__name__": "gpuguard_exporter_last_poll_timestamp_seconds", "node": "x"},
         "value": [0, "NaN"]},
        {"metric": {"__name__": "gpuguard_gpu_state", "node": "a", "gpu": "0"}},
        {"metric": "junk", "value": [0, "1"]},
        {"metric": {"__name__": "gpuguard_gpu_state", "node": "a", "gpu": "0"}, "value": [0, 1]},
        {"metric": {"__name__": "gpuguard_actuator_node_provisionable", "node": "a"},
         "value": [0, "NaN"]},
        "junk",
    ],
)  # fmt: skip
def test_a_malformed_sample_never_stops_the_node_list(sample: Any) -> None:
    views = views_from_samples([*reply("a"), sample, *reply("b")], now=1000.0)
    assert {v.record.node for v in views} >= {"b"}
    placer = Placer(StaticSource(views), Settings(), clock=lambda: 1000.0)
    assert placer.nodes("").code == 200


def test_http_reservations_by_clients_a_web_config_authenticated(
    placer: Placer, tmp_path: Path
) -> None:
    from gpuguard.web.webconfig import WebConfigWatcher, load_web_config
    from tests.support.tlscerts import write_web_config

    web = WebConfigWatcher(
        load_web_config(write_web_config(tmp_path / "web.yml", None, {"scheduler": "pw"})),
        require_auth=True,
    )
    port = free_port()
    srv = placer_server(("127.0.0.1", port), placer, token=None, web=web)
    srv.serve_in_thread()
    try:
        url = f"http://127.0.0.1:{port}/api/v1/placement"
        form = {"deadline": "9s", "memory": "1GiB"}
        refused = requests.post(url, data=form, timeout=5)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Basic"
        placed = requests.post(url, data=form, auth=("scheduler", "pw"), timeout=5)
        assert placed.status_code == 200, placed.text
        assert len(placer.reservations) == 1
    finally:
        srv.shutdown()
        srv.server_close()
