"""The placer's records from a Prometheus that is slow: kube-scheduler's extender verbs over
real HTTP on loopback, against a Prometheus stand-in that delays or trickles its reply.

One pod's filter and prioritize cost one query however slow the reply; callers at the same
moment share one query; ``--prometheus.timeout`` bounds the whole answer, so a trickling
Prometheus is a counted 503 well before kube-scheduler's ``httpTimeout`` (3 s), never a 200
after it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from gpuguard.placer import extender
from gpuguard.placer.http import placer_server
from gpuguard.placer.service import Placer
from gpuguard.placer.source import PrometheusSource
from gpuguard.promquery import QueryFailed, instant_query
from gpuguard.web.server import HttpServer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from standins.slow_prometheus import SlowPrometheus

NODES = ["gpu-a", "gpu-b"]
FILTER = f"{extender.PATH_PREFIX}/{extender.FILTER_VERB}"
PRIORITIZE = f"{extender.PATH_PREFIX}/{extender.PRIORITIZE_VERB}"
#: kube-scheduler's ``httpTimeout`` in the shipped KubeSchedulerConfiguration
SCHEDULER_TIMEOUT_S = 3.0


def pod_body(nodes: list[str]) -> bytes:
    pod = {
        "metadata": {
            "name": "infer-0",
            "namespace": "team-a",
            "labels": {"gpuguard.deadline": "9s", "gpuguard.memory": "4GiB"},
        }
    }
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": nodes}).encode()


class Placed:
    """A placer with the extender on loopback, reading ``prometheus``."""

    def __init__(self, prometheus: SlowPrometheus, timeout_s: float, cache_s: float) -> None:
        self.source = PrometheusSource(prometheus.url, timeout_s, cache_s)
        self.placer = Placer(self.source)
        self.server: HttpServer = placer_server(
            ("127.0.0.1", 0), self.placer, None, with_extender=True
        )
        self.server.serve_in_thread()
        host, port = self.server.server_address[:2]
        self.url = f"http://{host}:{port}"

    def post(self, path: str) -> requests.Response:
        headers = {"Content-Type": "application/json"}
        return requests.post(self.url + path, data=pod_body(NODES), headers=headers, timeout=30)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.source.close()


@pytest.fixture
def placed() -> Iterator[list[Placed]]:
    made: list[Placed] = []
    yield made
    for one in made:
        one.close()
    assert not [t for t in threading.enumerate() if t.name == "placer-records"]


def test_one_pods_filter_and_prioritize_cost_one_query_at_a_prometheus_slower_than_the_cache(
    placed: list[Placed],
) -> None:
    with SlowPrometheus(NODES, delay_s=0.6) as prometheus:
        placer = Placed(prometheus, timeout_s=2.0, cache_s=0.5)
        placed.append(placer)
        filtered = placer.post(FILTER)
        scored = placer.post(PRIORITIZE)
        assert filtered.status_code == 200 and filtered.json()["NodeNames"] == NODES
        assert scored.status_code == 200 and {s["Score"] for s in scored.json()} == {10, 1}
        assert prometheus.queries == 1  # the reply is reused from when it arrived


@pytest.mark.parametrize(("delay_s", "code"), [(0.6, 200), (1.5, 503)])
def test_callers_at_the_same_moment_share_one_query(
    placed: list[Placed], delay_s: float, code: int
) -> None:
    # a Prometheus slower than the timeout: each caller waiting its turn to ask again would
    # answer the last after 4 timeouts, past kube-scheduler's
    with SlowPrometheus(NODES, delay_s=delay_s) as prometheus:
        placer = Placed(prometheus, timeout_s=1.0, cache_s=0.5)
        placed.append(placer)
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: placer.post(FILTER), range(4)))
        assert [a.status_code for a in answers] == [code] * 4
        assert prometheus.queries == 1
        assert time.monotonic() - started < SCHEDULER_TIMEOUT_S - 1.0


@pytest.mark.parametrize("trickle_head", [False, True], ids=["body", "head"])
def test_a_trickling_prometheus_is_a_counted_503_before_kube_schedulers_timeout(
    placed: list[Placed], trickle_head: bool
) -> None:
    # every byte comes well within the timeout of a read; the whole answer never does
    with SlowPrometheus([], byte_every_s=0.05, trickle_head=trickle_head) as prometheus:
        placer = Placed(prometheus, timeout_s=1.0, cache_s=1.0)
        placed.append(placer)
        started = time.monotonic()
        filtered = placer.post(FILTER)
        answered_s = time.monotonic() - started
        assert filtered.status_code == 503, filtered.text
        assert "no whole answer within 1s" in filtered.json()["error"]
        assert 0.9 < answered_s < SCHEDULER_TIMEOUT_S - 1.0
        metrics = requests.get(placer.url + "/metrics", timeout=5).text
        assert 'gpuguard_placer_requests_total{code="503",endpoint="extender_filter"} 1.0' in (
            metrics
        )
        assert "gpuguard_placer_records_up 0.0" in metrics


def test_a_reply_is_read_to_a_deadline_and_a_size() -> None:
    session = requests.Session()
    try:
        with SlowPrometheus([], byte_every_s=0.05) as trickling:
            started = time.monotonic()
            with pytest.raises(QueryFailed, match=r"no whole answer within 0\.5s"):
                instant_query(session, trickling.url, "up", 0.5)
            assert time.monotonic() - started < 1.5  # the deadline, plus at most one read
        with SlowPrometheus(NODES * 50) as large:
            assert len(instant_query(session, large.url, "up", 5.0)) == 800
            with pytest.raises(QueryFailed, match="larger than 1000 bytes"):
                instant_query(session, large.url, "up", 5.0, max_bytes=1000)
    finally:
        session.close()
