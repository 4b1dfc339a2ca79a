"""Wire the actuator together and run it until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import docker

from gpuguard.actuator.audit import AUDIT_FILE, AuditLog
from gpuguard.actuator.config import Config
from gpuguard.actuator.controller import Controller
from gpuguard.actuator.errors import ExporterUnavailable, StateError
from gpuguard.actuator.executor import DockerExecutor
from gpuguard.actuator.fastpath import FastPath
from gpuguard.actuator.journal import Journal
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.actuator.nodes import SwarmMarker
from gpuguard.actuator.server import ActuatorServer
from gpuguard.actuator.state import ExporterClient
from gpuguard.actuator.watchdog import spawn as spawn_watchdog
from gpuguard.contract import TriggerSource

log = logging.getLogger("gpuguard.actuator")

MAINTENANCE_PERIOD_S = 0.5
DOCKER_TIMEOUT_S = 5


def docker_api(url: str | None) -> Any:
    """A low-level Docker client for ``url``, or for DOCKER_HOST / the local socket."""
    if url:
        return docker.APIClient(base_url=url, timeout=DOCKER_TIMEOUT_S)
    return docker.from_env(timeout=DOCKER_TIMEOUT_S).api


def run(config: Config) -> int:
    """Start everything, serve until a signal, resume what we paused, exit."""
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for warning in config.warnings:
        log.warning(warning)
    journal = Journal(config.state_dir)
    journal.save()  # claim the journal: a previous actuator's watchdog now leaves it to us
    audit = AuditLog(config.state_dir / AUDIT_FILE)
    local_api = docker_api(config.docker_host)
    manager_api = docker_api(config.swarm_manager) if config.swarm_manager else local_api
    metrics = ActuatorMetrics(config.node_name)
    executor = DockerExecutor(local_api, journal, audit, dry_run=config.dry_run)
    controller = Controller(
        config,
        lambda: ExporterClient(config.exporter_url, timeout_s=min(2.0, config.exporter_timeout_s)),
        executor,
        journal,
        audit,
        metrics,
        SwarmMarker(local_api, manager_api),
    )
    watchdog = spawn_watchdog(config.state_dir, config.docker_host)
    log.info("watchdog %d guards containers this actuator pauses", watchdog.pid)
    _start_up_reconcile(controller)
    try:
        server = ActuatorServer((config.listen_host, config.listen_port), controller, config.token)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", config.listen_host, config.listen_port, exc)
        controller.resume_all("start-up failed", TriggerSource.RECONCILE)
        return 1
    server.serve_in_thread()
    fast = None
    if config.mode in ("fast", "both"):
        fast = FastPath(controller, ExporterClient(config.exporter_url, timeout_s=2.0))
        fast.start()
    audit.write("start", mode=config.mode, order=config.policy.order, dry_run=config.dry_run)
    log.info(
        "actuator on %s:%d (node %s, mode %s, order %s%s)",
        config.listen_host, server.server_address[1], config.node_name, config.mode,
        config.policy.order, ", dry run" if config.dry_run else "",
    )  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.is_set():
        started = time.monotonic()
        try:
            controller.maintain()
        except Exception:  # maintenance must go on
            log.exception("maintenance failed")
        stop.wait(max(0.0, MAINTENANCE_PERIOD_S - (time.monotonic() - started)))
    log.info("stopping: resuming every container this actuator paused")
    server.shutdown()
    if fast is not None:
        fast.stop()
    controller.resume_all("actuator stopping", TriggerSource.RECONCILE)
    audit.write("stop")
    audit.close()
    return 0


def _start_up_reconcile(controller: Controller) -> None:
    """Settle what a previous run left: journal vs Docker vs state, and the node label."""
    try:
        state = controller.fetch_state()
    except (ExporterUnavailable, StateError) as exc:
        log.warning("exporter not reachable at start (%s)", exc)
        state = None
    if state is not None and state.node != controller.config.node_name:
        log.warning(
            "exporter reports node %r but --node.name is %r: alerts are matched on --node.name",
            state.node, controller.config.node_name,
        )  # fmt: skip
    if controller.journal.paused:
        log.info("start-up: %d container(s) in the journal", len(controller.journal.paused))
    controller.reconcile(state)
    controller.apply_node_mark()
