"""The ``server`` workload's request latency as a Prometheus histogram, and its requests in
flight as a gauge, in vLLM's format.

vLLM exports ``vllm:e2e_request_latency_seconds`` (arrival to last token, seconds) labelled
``model_name`` with prometheus_client, so its bucket bounds read ``0.3``, ``1.0``, ...; this
is the same family, so gpuguard's SLO rules run on gpusim exactly as on a vLLM server. vLLM's
buckets start at 0.3 s (LLM requests); a simulated request takes milliseconds, so finer
bounds come first and vLLM's follow. prometheus_client is imported only when a port is given:
the workload runs without it on a real-GPU machine.
"""

from __future__ import annotations

from typing import Any

E2E_LATENCY = "vllm:e2e_request_latency_seconds"
E2E_HELP = "Histogram of e2e request latency in seconds."
#: vLLM's gauge of requests being answered (gpuguard.inflight.metric)
RUNNING = "vllm:num_requests_running"
RUNNING_HELP = "Number of requests in model execution batches."
MODEL_LABEL = "model_name"
#: vLLM's request-latency buckets, after finer ones for millisecond requests
BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25,
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
DEFAULT_ADDRESS = "127.0.0.1"


class LatencyMetrics:
    """One histogram child (this server's model) in a registry of its own."""

    def __init__(self, model_name: str) -> None:
        from prometheus_client import CollectorRegistry, Gauge, Histogram

        self.registry = CollectorRegistry()
        histogram = Histogram(
            E2E_LATENCY, E2E_HELP, [MODEL_LABEL], registry=self.registry, buckets=BUCKETS
        )
        # The child exists from the start, as vLLM's does: its buckets read 0 before the
        # first request, so Prometheus sees the series (and a rate of 0) at once.
        self._child: Any = histogram.labels(model_name)
        gauge = Gauge(RUNNING, RUNNING_HELP, [MODEL_LABEL], registry=self.registry)
        self._running: Any = gauge.labels(model_name)

    def observe(self, seconds: float) -> None:
        self._child.observe(seconds)

    def running(self, requests: int) -> None:
        """Requests being answered now."""
        self._running.set(requests)

    def serve(self, port: int, address: str = DEFAULT_ADDRESS) -> None:
        """Serve ``/metrics`` on ``address:port`` from a daemon thread (until the exit)."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=address, registry=self.registry)
