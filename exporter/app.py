"""Wiring: build every part from an ExporterConfig, run until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import threading
from typing import Any

from gpuguard.exporter.backends.base import open_backend
from gpuguard.exporter.cgroup import ProcReader
from gpuguard.exporter.config import ExporterConfig, pick_container_source
from gpuguard.exporter.containerd import ContainerdIndex, Ctr
from gpuguard.exporter.containers import ContainerIndex
from gpuguard.exporter.errors import BackendUnavailable
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.http import exporter_server
from gpuguard.exporter.poller import Poller
from gpuguard.exporter.record import NodeRecorder
from gpuguard.exporter.tracker import Tracker
from gpuguard.exporter.trust import TRUSTING
from gpuguard.web.webconfig import WebConfigWatcher

log = logging.getLogger("exporter")

# How long start-up waits for the first container resync, so that the first tasks seen
# already know their container's deadline (the tracker also fills it in later).
_SYNC_WAIT_S = 3.0


def docker_client_factory(url: str) -> Any:
    def make() -> Any:
        import docker

        return docker.DockerClient(base_url=url, timeout=10)

    return make


def open_container_source(
    config: ExporterConfig, events: EventLog
) -> tuple[ContainerIndex | ContainerdIndex, str]:
    """The one container source this exporter follows (``--container.source``), and where;
    not started: it contacts the engine once ``start()`` is called."""
    if pick_container_source(config) == "containerd":
        ctr = Ctr(config.containerd_address, config.containerd_namespace)
        where = f"containerd {config.containerd_address} (namespace {config.containerd_namespace})"
        return ContainerdIndex(ctr, events, policy=config.trust), where
    index = ContainerIndex(docker_client_factory(config.docker_host), events, policy=config.trust)
    return index, f"docker {config.docker_host}"


def run_exporter(config: ExporterConfig) -> int:
    """Run the exporter; returns the process exit status."""
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        backend = open_backend(config.gpu_backend, config.gpusim_socket)
    except BackendUnavailable as exc:
        print(f"gpuguard exporter: {exc}", file=sys.stderr)
        return 1
    # Whoever starts a container sets its labels: say which of their claims are believed.
    level = logging.WARNING if config.trust.kind == TRUSTING else logging.INFO
    log.log(level, "trust policy: %s", config.trust.describe())
    events = EventLog(config.events_buffer)
    if pick_container_source(config) == "containerd" and shutil.which("ctr") is None:
        print("gpuguard exporter: the containerd source needs ctr on PATH "
              "(Debian's containerd package)", file=sys.stderr)  # fmt: skip
        backend.close()
        return 1
    index, source = open_container_source(config, events)
    poller = Poller(
        backend,
        index,
        ProcReader(config.procfs),
        Tracker(events, config.history_size, config.task_rules),
        events,
        config.node_name,
        config.poll_interval_s,
        recorder=NodeRecorder(config.node_name, config.record),
        trust_policy=(config.trust.kind, config.trust.path),
    )
    try:
        web = WebConfigWatcher(config.web) if config.web is not None else None
        address = (config.listen_host, config.listen_port)
        server = exporter_server(address, poller, events, web=web)
    except OSError as exc:
        print(
            f"gpuguard exporter: cannot listen on {config.listen_host}:{config.listen_port}: "
            f"{exc.strerror}",
            file=sys.stderr,
        )
        backend.close()
        return 1
    index.start()  # once listening: a port in use is its one line, with no engine warnings
    if not index.wait_synced(_SYNC_WAIT_S):
        log.warning("%s not reachable yet; retrying in the background", source)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    poll_thread = threading.Thread(target=poller.run, args=(stop,), name="poller", daemon=True)
    poll_thread.start()
    server.serve_in_thread()
    host, port = server.server_address[:2]
    log.info(
        "listening on %s://%s:%s (backend %s, %s, poll %gs)",
        config.web.scheme if config.web else "http", host, port, backend.name, source,
        config.poll_interval_s,
    )  # fmt: skip
    stop.wait()
    log.info("stopping")
    server.shutdown()
    server.server_close()
    poll_thread.join(timeout=5)
    index.stop()
    backend.close()
    return 0
