"""Helpers for the exporter's integration tests: a real exporter subprocess and workloads."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.process import ManagedProcess, free_port

SCALE = 0.05  # gpusim time scale: a kernel of W device-seconds lasts W * SCALE s


class ExporterProcess:
    """``python -m gpuguard.cli exporter`` on a free port, stopped by its PID."""

    def __init__(self, log_dir: Path, docker_url: str, gpusim_socket: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            sys.executable, "-m", "gpuguard.cli", "exporter",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--gpu.backend=gpusim",
            f"--gpusim.socket={gpusim_socket}",
            f"--docker.host={docker_url}",
            "--node.name=itest",
            *extra,
        ]  # fmt: skip
        self.process = ManagedProcess("exporter", argv, log_dir / f"exporter-{self.port}.log")

    def start(self) -> ExporterProcess:
        self.process.start()
        self.process.wait_ready(lambda: requests.get(self.url + "/healthz", timeout=1).ok, 30)
        return self

    def stop(self) -> None:
        self.process.stop()

    def get(self, path: str, timeout: float = 5) -> requests.Response:
        return requests.get(self.url + path, timeout=timeout)

    def state(self) -> dict[str, Any]:
        reply = self.get("/api/v1/state")
        reply.raise_for_status()
        doc: dict[str, Any] = reply.json()
        return doc

    def events(self, since: int = 0, timeout: float = 0) -> dict[str, Any]:
        reply = self.get(f"/api/v1/events?since={since}&timeout={timeout}", timeout=timeout + 5)
        reply.raise_for_status()
        doc: dict[str, Any] = reply.json()
        return doc

    def metrics_text(self) -> str:
        reply = self.get("/metrics")
        reply.raise_for_status()
        return reply.text

    def metric(self, name: str, **labels: str) -> float | None:
        return sample_value(self.metrics_text(), name, **labels)


def sample_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the first sample named ``name`` whose labels include ``labels``."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return None


def workload_args(sim: GpusimService, log_name: str, *args: str) -> list[str]:
    return [
        "gpuguard.gpusim.workload",
        "--socket",
        str(sim.socket),
        "--log",
        str(sim.dir / log_name),
        *args,
    ]


def sim_mounts(sim: GpusimService) -> dict[str, dict[str, str]]:
    """The daemon's directory (socket and logs) at the same path inside the container."""
    return {str(sim.dir): {"bind": str(sim.dir), "mode": "rw"}}


def workload_log(sim: GpusimService, log_name: str) -> list[dict[str, Any]]:
    path = sim.dir / log_name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def restart_dockerd_process(engine: PrivateDockerd) -> None:
    """Stop and start only the dockerd process (PrivateDockerd.stop() would remove containers)."""
    assert engine.process is not None
    engine.process.stop(timeout=30)
    engine.process = None
    engine.start()
