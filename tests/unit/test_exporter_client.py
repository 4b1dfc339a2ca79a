"""The actuator's client of the exporter: one retry for a connection dropped without answer."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from gpuguard.actuator.errors import ExporterUnavailable
from gpuguard.actuator.exporter_client import ExporterClient

EVENTS = json.dumps({"events": [], "next": 3, "truncated": False}).encode()


@pytest.fixture
def flaky_server() -> Iterator[tuple[str, list[str]]]:
    """Drops the first connection after reading its request; answers every later one."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[str] = []

    def serve() -> None:
        for n in range(2):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                seen.append(conn.recv(65536).decode().split("\r\n")[0])
                if n == 0:
                    continue  # closed without a word, as a racing idle timeout would
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(EVENTS)}\r\n"
                conn.sendall(head.encode() + b"Content-Type: application/json\r\n\r\n" + EVENTS)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    listener.close()
    thread.join(5)


def test_a_get_dropped_without_an_answer_is_sent_once_more(
    flaky_server: tuple[str, list[str]],
) -> None:
    url, seen = flaky_server
    client = ExporterClient(url, timeout_s=2)
    assert client.events(0, 0).next == 3
    assert client.retries == 1 and len(seen) == 2 and seen[0] == seen[1]
    client.close()


def test_timeouts_are_not_retried() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    client = ExporterClient(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.2)
    with pytest.raises(ExporterUnavailable):
        client.state()
    assert client.retries == 0
    client.close()
    listener.close()
