"""Servers' own in-flight gauges: the labels that declare one, its value in /metrics text,
and the exporter's reader against a real HTTP server on loopback (edges, bounds, errors)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuguard.contract import ActivitySource, EventType
from gpuguard.exporter.collector import build_rows
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.inflight import MAX_BYTES, GaugeReader
from gpuguard.exporter.model import ContainerInfo
from gpuguard.inflight import InflightDeclaration, declaration, gauge_value
from tests.unit.exporter_fakes import cid, three_container_poller


def test_declaration_takes_its_port_or_the_slo_port() -> None:
    labels = {"gpuguard.inflight.metric": "vllm:num_requests_running", "gpuguard.slo.port": "80"}
    declared, errors = declaration(labels)
    assert declared == InflightDeclaration("vllm:num_requests_running", 80) and not errors
    assert declared.series_name == "vllm_num_requests_running"
    labels["gpuguard.inflight.port"] = "9000"
    assert declaration(labels)[0] == InflightDeclaration("vllm:num_requests_running", 9000)
    assert declaration({}) == (None, ())


@pytest.mark.parametrize(
    ("labels", "bad"),
    [
        ({"gpuguard.inflight.metric": "9lives", "gpuguard.slo.port": "80"}, "metric"),
        ({"gpuguard.inflight.metric": "x"}, "metric"),  # no port to read it from
        ({"gpuguard.inflight.metric": "x", "gpuguard.inflight.port": "0"}, "port"),
    ],
)
def test_an_unusable_declaration_is_reported_and_absent(labels: dict[str, str], bad: str) -> None:
    declared, errors = declaration(labels)
    assert declared is None
    assert any(label == f"gpuguard.inflight.{bad}" for label, _ in errors)


def test_gauge_value_sums_the_series_of_either_spelling() -> None:
    text = (
        "# HELP vllm:num_requests_running Requests running.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="a"} 2.0\n'
        'vllm_num_requests_running{model_name="b"} 1 1700000000000\n'
        "vllm:num_requests_running_other 7\n"
        'vllm:num_requests_running{x="y"} NaNx\n'
    )
    for declared in ("vllm:num_requests_running", "vllm_num_requests_running"):
        name = InflightDeclaration(declared, 1).series_name
        assert gauge_value(text, name) == 3.0
        assert gauge_value("other 1\n", name) is None


class Gauge:
    """A real /metrics server on loopback whose gauge a test sets."""

    def __init__(self) -> None:
        self.value = 0.0
        self.body: bytes | None = None  # overrides the page
        self.delay_s = 0.0
        gauge = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                time.sleep(gauge.delay_s)
                body = gauge.body or f"requests_running {gauge.value}\n".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gauge() -> Iterator[Gauge]:
    server = Gauge()
    yield server
    server.stop()


def reader(port: int, probed: bool = False) -> tuple[GaugeReader, EventLog]:
    info = ContainerInfo(
        id=cid(1), name="server", image="i", state="running",
        inflight=InflightDeclaration("requests_running", port),
    )  # fmt: skip
    events = EventLog(100)
    return GaugeReader(lambda: {info.id: info}, events, probed=lambda _c: probed), events


def test_reader_publishes_busy_and_idle_edges(gauge: Gauge) -> None:
    read, events = reader(gauge.port)
    read.read_once()
    assert read.view()[cid(1)].value == 0.0 and not events.since(0).events
    gauge.value = 2
    read.read_once()
    read.read_once()
    gauge.value = 0
    read.read_once()
    edges = [(e["type"], e["source"], e["container"]) for e in events.since(0).events]
    assert edges == [
        (EventType.GPU_BUSY, ActivitySource.GAUGE, "server"),
        (EventType.GPU_IDLE, ActivitySource.GAUGE, "server"),
    ]
    idle = events.since(0).events[1]
    assert idle["busy_since"] == events.since(0).events[0]["ts"] and idle["run_s"] >= 0


def test_reader_leaves_edges_to_the_probe_where_it_sees_the_container(gauge: Gauge) -> None:
    read, events = reader(gauge.port, probed=True)
    gauge.value = 1
    read.read_once()
    assert read.view()[cid(1)].value == 1.0 and not events.since(0).events


@pytest.mark.parametrize(
    ("setup", "error"),
    [
        (lambda g: setattr(g, "body", b"x" * (MAX_BYTES + 10)), "larger than"),
        (lambda g: setattr(g, "body", b"other 1\n"), "no requests_running"),
        (lambda g: setattr(g, "delay_s", 1.0), "timed out"),
    ],
)
def test_reader_is_bounded_in_size_and_time(gauge: Gauge, setup: Any, error: str) -> None:
    setup(gauge)
    read, _ = reader(gauge.port)
    started = time.monotonic()
    read.read_once()
    assert time.monotonic() - started < 0.8  # 50 ms a read, not the server's whole second
    reading = read.view()[cid(1)]
    assert reading.value is None and reading.error is not None and error in reading.error


def test_reader_reports_a_closed_port() -> None:
    server = Gauge()
    port = server.port
    server.stop()
    read, _ = reader(port)
    read.read_once()
    assert "cannot read" in (read.view()[cid(1)].error or "")


def test_a_read_gauge_is_the_source_and_a_metric(tmp_path: Path) -> None:
    from gpuguard.exporter.inflight import GaugeReading

    _, _, poller = three_container_poller(tmp_path / "proc")
    poller.inflight = lambda: {cid(1): GaugeReading(3.0, 1.0)}
    rows = build_rows(poller.poll_once())
    sources = {
        (labels.values[4], labels.values[5])
        for labels, _ in rows.gauges["gpuguard_container_activity_source"]
    }
    assert (cid(1)[:12], ActivitySource.GAUGE) in sources
    assert (cid(2)[:12], ActivitySource.NVML) in sources
    assert [v for _, v in rows.gauges["gpuguard_container_inflight_requests"]] == [3.0]
