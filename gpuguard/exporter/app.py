"""Wiring: build every part from an ExporterConfig, run until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from gpuguard.contract import ProbeReason
from gpuguard.exporter.activity import ActivityFeed, ActivityTracker
from gpuguard.exporter.backends.base import open_backend
from gpuguard.exporter.cgroup import ProcReader
from gpuguard.exporter.config import ExporterConfig, pick_container_source
from gpuguard.exporter.containerd import ContainerdIndex, Ctr
from gpuguard.exporter.containers import ContainerIndex
from gpuguard.exporter.errors import BackendUnavailable
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.http import exporter_server
from gpuguard.exporter.inflight import GaugeReader
from gpuguard.exporter.launchprobe import (
    LaunchProbe,
    ProbeStatus,
    find_library,
    installed_binary,
)
from gpuguard.exporter.poller import ContainerSource, Poller
from gpuguard.exporter.probe.build import probe_binary
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


def make_launch_probe(
    config: ExporterConfig, index: ContainerSource, events: EventLog, backend: str
) -> tuple[LaunchProbe | None, ActivityTracker, ProbeStatus]:
    """The launch probe (not started) and its tracker; where it is off, the status says so."""

    def name_of(cid: str) -> str | None:
        info = index.snapshot().get(cid)
        return info.name if info is not None else None

    probe_config = config.probe
    tracker = ActivityTracker(
        events, probe_config.task_gap_s, probe_config.idle_timeout_s, names=name_of
    )
    if not probe_config.enabled:
        log.info("launch probe off (--probe.launch=off): activity from NVML samples only")
        return None, tracker, ProbeStatus(False, ProbeReason.OFF, "--probe.launch=off")
    explicit = probe_config.binary
    found = installed_binary()

    def binary() -> Path:
        return explicit or found or probe_binary()

    feed = ActivityFeed(ProcReader(config.procfs), index.snapshot, tracker)
    socket = config.gpusim_socket if backend == "gpusim" else None
    library = find_library(probe_config.library, socket)
    # a container is idle only after --probe.task-gap without calls, so a launch after a
    # shorter quiet cannot be a busy edge (under 1 ms, the edges wait for the ticks)
    wake_gap_s = max(probe_config.task_gap_s, 0.001)
    probe = LaunchProbe(
        binary, library, probe_config.interval_s, feed.on_tick, feed.on_wake, wake_gap_s,
        on_quiet=feed.on_quiet,
    )  # fmt: skip
    feed.ask_tick = probe.tick_at
    return probe, tracker, probe.status


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
    probe, activity, probe_status = make_launch_probe(config, index, events, backend.name)
    gauges = GaugeReader(index.snapshot, events, config.gauge_host, probed=activity.probed)
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
        activity=activity.view,
        probe=lambda: probe.status if probe is not None else probe_status,
        inflight=gauges.view,
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
    # once listening: a port in use is its one line, with no probe or engine warnings
    if probe is not None:
        probe_status = probe.start()
    index.start()
    if not index.wait_synced(_SYNC_WAIT_S):
        log.warning("%s not reachable yet; retrying in the background", source)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    poll_thread = threading.Thread(target=poller.run, args=(stop,), name="poller", daemon=True)
    poll_thread.start()
    gauge_thread = threading.Thread(target=gauges.run, args=(stop,), name="gauges", daemon=True)
    gauge_thread.start()
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
    gauge_thread.join(timeout=5)
    if probe is not None:
        probe.stop()
    index.stop()
    backend.close()
    return 0
