"""The exporter's and the actuator's HTTP servers as deployed: real processes on loopback,
under the loads and attacks of issue 9, bounded in count and time.

Each test asserts what must hold (every client answered, a 4xx for every bad input, no
thread per follower, memory that does not follow unauthenticated bodies); how fast it is
measured lives in ``bench/http_load.py``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from exporter_support import sample_value

from gpuguard.actuator.exporter_client import ExporterClient
from gpuguard.demo.stack import httpload
from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.localstack import NodeStack
from gpuguard.demo.stack.process import ServiceError
from tests.prereq import require_binary, unavailable
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"
NODE = "itest"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def node(dockerd: PrivateDockerd, short_tmp: Path) -> Iterator[NodeStack]:
    """gpusim, exporter and actuator on the session's dockerd (which outlives the module)."""
    stack = NodeStack(Path(tempfile.mkdtemp(prefix="http-", dir=short_tmp)), NODE, engine=dockerd)
    try:
        stack.start_services()
    except ServiceError as exc:
        stop_services(stack)
        unavailable(f"node did not start: {exc}")
    yield stack
    stop_services(stack)


def stop_services(stack: NodeStack) -> None:
    stack.engine = None  # the session's engine: not ours to stop
    stack.stop()


def token(stack: NodeStack) -> str:
    assert stack.token_file is not None
    return stack.token_file.read_text().strip()


def webhook(gpus: range | tuple[int, ...] = (0,), **labels: str) -> bytes:
    """GpuguardGpuSaturatedContention firing on this node, once per GPU in ``gpus``."""
    doc = json.loads((FIXTURES / "firing.json").read_text())
    template = json.dumps(doc["alerts"][0] | {"annotations": {}, "generatorURL": ""})
    alerts = []
    for gpu in gpus:
        alert = json.loads(template)
        alert["labels"].update({"node": NODE, "gpu": str(gpu), **labels})
        alert["fingerprint"] = f"{gpu:016x}"
        alerts.append(alert)
    doc["alerts"] = alerts
    return json.dumps(doc).encode()


def post_alerts(stack: NodeStack, body: bytes, bearer: str | None = None) -> requests.Response:
    headers = {"Content-Type": "application/json"}
    headers["Authorization"] = f"Bearer {bearer or token(stack)}"
    return requests.post(
        stack.actuator_url + "/api/v1/alerts", data=body, headers=headers, timeout=60
    )


def metric(url: str, name: str, **labels: str) -> float | None:
    return sample_value(requests.get(url + "/metrics", timeout=5).text, name, **labels)


def pids(stack: NodeStack) -> tuple[int, int]:
    assert stack.exporter is not None and stack.actuator is not None
    return stack.exporter.pid, stack.actuator.pid


def test_listen_backlog_is_at_least_128(node: NodeStack) -> None:
    ss = require_binary("ss")
    for port in (node.exporter_port, node.actuator_port):
        out = subprocess.run(
            [ss, "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
        ).stdout.split()
        assert int(out[2]) >= 128, out  # Send-Q of a listening socket is its backlog


def test_landing_page_gzip_and_process_metrics_on_both(node: NodeStack) -> None:
    for url, endpoint in (
        (node.exporter_url, "/api/v1/state"),
        (node.actuator_url, "/api/v1/nodes"),
    ):
        page = requests.get(url + "/", timeout=5)
        assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
        assert f'href="{endpoint}"' in page.text
        for path in ("/metrics", endpoint):
            reply = requests.get(url + path, headers={"Accept-Encoding": "gzip"}, timeout=5)
            assert reply.headers.get("Content-Encoding") == "gzip", path
            plain = requests.get(url + path, headers={"Accept-Encoding": "identity"}, timeout=5)
            assert "Content-Encoding" not in plain.headers
        assert (metric(url, "process_resident_memory_bytes") or 0) > 0
        assert (metric(url, "process_open_fds") or 0) > 0


def test_burst_of_300_scrapes_is_answered(node: NodeStack) -> None:
    httpload.raise_fd_limit(4096)
    for port in (node.exporter_port, node.actuator_port):
        results = asyncio.run(httpload.burst(port, "/metrics", 300, timeout=30))
        failed = [r for r in results if not isinstance(r, httpload.Reply) or r.status != 200]
        assert not failed, failed[:5]


def test_keep_alive_is_kept_and_closing_is_said(node: NodeStack) -> None:
    async def exchange() -> list[tuple[int, dict[str, str]]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", node.exporter_port)
        replies = []
        for i in range(100):
            close = [("Connection", "close")] if i == 99 else []
            writer.write(httpload.head("GET", "/healthz", close))
            status, headers, _ = await httpload.read_reply(reader)
            replies.append((status, headers))
        assert await reader.read() == b""  # closed after the reply that said so
        writer.close()
        return replies

    replies = asyncio.run(exchange())
    assert all(status == 200 for status, _ in replies)
    assert [h.get("connection") for _, h in replies[:-1]] == [None] * 99
    assert replies[-1][1]["connection"] == "close"


def test_2000_pooled_requests_from_the_actuator_client_all_succeed(node: NodeStack) -> None:
    client = ExporterClient(node.exporter_url, timeout_s=5)
    failures: list[str] = []

    def work() -> None:
        for _ in range(500):
            try:
                client.state()
            except Exception as exc:  # counted, not raised: every one must succeed
                failures.append(repr(exc))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pool = client.session.get_adapter(node.exporter_url).poolmanager
    pool_conns = pool.connection_from_url(node.exporter_url).num_connections
    client.close()
    assert failures == []
    assert pool_conns <= 8  # kept-alive connections were reused, not one per request


def test_authenticated_bad_inputs_get_a_4xx(node: NodeStack) -> None:
    bad = [
        b"[" * 1000 + b"]" * 1000,
        webhook().replace(b"2025-11-22T01:02:03.123456789Z", b"9999-12-31T23:59:59-23:59"),
        webhook(gpu="\u00b2"),
        webhook(gpu="7" * 5000),
    ]
    for body in bad:
        reply = post_alerts(node, body)
        assert reply.status_code == 400, reply.text
    for query in ("since=%C2%B2", "since=" + "9" * 5000, "timeout=1e999"):
        reply = requests.get(f"{node.exporter_url}/api/v1/events?{query}", timeout=5)
        assert reply.status_code == 400, query


def test_a_webhook_naming_12000_gpus_makes_one_decision(node: NodeStack) -> None:
    before = metric(
        node.actuator_url, "gpuguard_actuator_decision_seconds_count", trigger="webhook"
    )
    reply = post_alerts(node, webhook(range(12_000)))
    assert reply.status_code == 200, reply.text
    after = metric(node.actuator_url, "gpuguard_actuator_decision_seconds_count", trigger="webhook")
    assert after == (before or 0) + 1


def test_state_shows_programs_not_their_arguments(
    node: NodeStack, run_python_container: Callable[..., Any]
) -> None:
    secret = "hunter2-" + str(time.time_ns())
    made = run_python_container(
        ["timeit", "-n1", "-r1", f"s='{secret}'; import time; time.sleep(60)"]
    )

    def shown() -> dict[str, Any] | None:
        state = requests.get(node.exporter_url + "/api/v1/state", timeout=5).json()
        return next((c for c in state["containers"] if c["id"] == made.id), None)

    container = wait_for(shown, 20, "the container in the state")
    assert container["command"].startswith("python")
    assert secret not in requests.get(node.exporter_url + "/api/v1/state", timeout=5).text


def test_followers_wait_without_a_thread_each(
    node: NodeStack, run_python_container: Callable[..., Any]
) -> None:
    exporter_pid, _ = pids(node)
    httpload.raise_fd_limit(4096)
    since = requests.get(node.exporter_url + "/api/v1/state", timeout=5).json()["seq"]
    threads_before = httpload.proc_status(exporter_pid)["Threads"]

    async def scenario() -> tuple[list[Any], int]:
        polls = [
            asyncio.create_task(httpload.follow(node.exporter_port, since, timeout=30))
            for _ in range(300)
        ]
        await asyncio.sleep(2.0)  # every follower is waiting now
        waiting_threads = httpload.proc_status(exporter_pid)["Threads"]
        await asyncio.to_thread(run_python_container, ["this"])  # container_started
        return await asyncio.gather(*polls, return_exceptions=True), waiting_threads

    results, waiting_threads = asyncio.run(scenario())
    answered = [r for r in results if isinstance(r, tuple) and json.loads(r[1])["events"]]
    assert len(answered) == 300, [r for r in results if r not in answered][:3]
    # the handler pool may still grow to its 8 workers; a thread per follower would be 300
    assert waiting_threads <= threads_before + 8


def test_unauthenticated_big_bodies_do_not_grow_memory(node: NodeStack) -> None:
    _, actuator_pid = pids(node)
    httpload.raise_fd_limit(4096)
    senders = httpload.unauthenticated_senders(node.actuator_port, "/api/v1/alerts", 100, 4 * MIB)
    statuses, grown_kb = asyncio.run(httpload.rss_growth(actuator_pid, senders))
    assert statuses == [401] * 100
    assert grown_kb / 1024 <= 20, f"RSS grew by {grown_kb / 1024:.1f} MB"


def test_slow_loris_and_silent_connections_are_timed_out(node: NodeStack) -> None:
    async def scenario() -> tuple[bytes, bytes]:
        silent_reader, silent = await asyncio.open_connection("127.0.0.1", node.actuator_port)
        siege = httpload.Siege(node.actuator_port)
        reader = await siege.open_slow_loris(1, interval=0.5)
        async with asyncio.timeout(30):  # the header timeout is 10 s
            answer = await reader.read()
            closed = await silent_reader.read()
        await siege.close()
        silent.transport.abort()
        return answer, closed

    answer, closed = asyncio.run(scenario())
    assert answer.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in answer
    assert closed == b""


def test_exhausted_file_limit_neither_spins_nor_stops_answering(
    node: NodeStack, dockerd: PrivateDockerd, short_tmp: Path
) -> None:
    """An actuator allowed 256 files, 600 idle connections: it evicts, answers, stays idle."""
    second = NodeStack(
        Path(tempfile.mkdtemp(prefix="fd-", dir=short_tmp)),
        NODE,
        engine=dockerd,
        exporter_port=node.exporter_port,
        actuator_mode="webhook",
    )
    second.launcher = (require_binary("prlimit"), "--nofile=256:256", "--")
    second.start_actuator()
    try:
        assert second.actuator is not None
        pid = second.actuator.pid
        httpload.raise_fd_limit(4096)

        async def scenario() -> tuple[float, httpload.Reply, httpload.Reply]:
            siege = httpload.Siege(second.actuator_port)
            await siege.open_idle(600)
            cpu = httpload.cpu_seconds(pid)
            await asyncio.sleep(3.0)
            cpu = httpload.cpu_seconds(pid) - cpu
            body = webhook()
            bearer = [("Authorization", f"Bearer {token(second)}")]
            hook = await httpload.request(
                second.actuator_port,
                "POST",
                "/api/v1/alerts",
                [*bearer, ("Content-Type", "application/json")],
                body,
                timeout=20,
            )
            health = await httpload.request(second.actuator_port, "GET", "/healthz", timeout=20)
            await siege.close()
            return cpu, hook, health

        cpu, hook, health = asyncio.run(scenario())
        assert cpu < 1.0, f"{cpu:.2f} s of CPU in 3 s while holding connections"
        assert hook.status == 200 and health.status == 200
        assert len(list(Path(f"/proc/{pid}/fd").iterdir())) <= 256
    finally:
        second.stop_actuator()
