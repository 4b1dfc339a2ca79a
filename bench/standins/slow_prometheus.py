"""A Prometheus stand-in on loopback that is slow in the ways a loaded one is: it answers
``GET /api/v1/query`` after ``delay_s``, or sends its head or body a byte at a time.

Every reply is a vector of idle one-GPU node records (``nodes``), stamped when asked, so the
placer ranks them. ``queries`` counts the queries. ``stop`` ends every reply under way (a
trickle ends at once) and joins the server's threads.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GIB = 2**30
#: The longest any reply may take, however slow it was asked to be.
MAX_REPLY_S = 20.0


def record_samples(nodes: list[str], now: float) -> list[dict[str, Any]]:
    """The records query's result for idle nodes with one 24 GiB GPU each."""
    samples = []

    def sample(name: str, labels: dict[str, str], value: float) -> None:
        samples.append({"metric": {"__name__": name, **labels}, "value": [now, repr(value)]})

    for node in nodes:
        gpu = {"node": node, "gpu": "0"}
        sample("gpuguard_exporter_last_poll_timestamp_seconds", {"node": node}, now - 0.5)
        sample("gpuguard_actuator_node_provisionable", {"node": node}, 1.0)
        sample("gpuguard_gpu_info", {**gpu, "name": "sim"}, 1.0)
        sample("gpuguard_gpu_state", gpu, 1.0)
        sample("gpuguard_gpu_free_memory_bytes", gpu, float(20 * GIB))
        sample("gpuguard_gpu_memory_total_bytes", gpu, float(24 * GIB))
        sample("gpuguard_gpu_busy_ratio", gpu, 0.1)
        sample("gpuguard_gpu_running_tasks", gpu, 0.0)
    return samples


class SlowPrometheus:
    """``delay_s`` before the reply; ``byte_every_s`` > 0 sends the body (or, with
    ``trickle_head``, the head) one byte at a time."""

    def __init__(
        self,
        nodes: list[str],
        delay_s: float = 0.0,
        byte_every_s: float = 0.0,
        trickle_head: bool = False,
    ) -> None:
        self.nodes = nodes
        self.delay_s = delay_s
        self.byte_every_s = byte_every_s
        self.trickle_head = trickle_head
        self.queries = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = False  # server_close joins every reply
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> SlowPrometheus:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> SlowPrometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _reply(self, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.queries += 1
        started = time.monotonic()
        if self._stop.wait(self.delay_s):
            return
        doc = {
            "status": "success",
            "data": {"resultType": "vector", "result": record_samples(self.nodes, time.time())},
        }
        body = json.dumps(doc).encode()
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        handler.close_connection = True
        if self.byte_every_s <= 0:
            handler.wfile.write(head + body)
            return
        slow, rest = (head, body) if self.trickle_head else (body, b"")
        if not self.trickle_head:
            handler.wfile.write(head)
        for i in range(len(slow)):
            if self._stop.wait(self.byte_every_s) or time.monotonic() - started > MAX_REPLY_S:
                return
            handler.wfile.write(slow[i : i + 1])
        handler.wfile.write(rest)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        prometheus = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if not self.path.startswith("/api/v1/query?"):
                    self.send_error(404)
                    return
                try:
                    prometheus._reply(self)
                except OSError:
                    pass  # the client gave up (its deadline): the reply ends here

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
