"""Wire the actuator together and run it until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

from gpuguard import flags
from gpuguard.actuator.admission.slosignal import SloSignal
from gpuguard.actuator.audit import AUDIT_FILE, AuditLog
from gpuguard.actuator.config import Config
from gpuguard.actuator.controller import Controller
from gpuguard.actuator.engine import open_engine
from gpuguard.actuator.engine.base import ContainerEngine
from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.engine.freezer import ContainerFreezer
from gpuguard.actuator.engine.swarm import SwarmMarker
from gpuguard.actuator.errors import ExporterUnavailable, StateError
from gpuguard.actuator.execution.executor import PauseExecutor
from gpuguard.actuator.exporter_client import ExporterClient
from gpuguard.actuator.fastpath import FastPath
from gpuguard.actuator.http import ActuatorServer
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.actuator.nodemarks.nodelist import NodeMarker
from gpuguard.actuator.nodemarks.taints import TaintMarker, kubernetes_api
from gpuguard.actuator.safety import lease
from gpuguard.actuator.safety.journal import (
    JOURNAL_FILE,
    Journal,
    JournalContent,
    JournalCorrupt,
    set_aside,
)
from gpuguard.actuator.safety.journallock import JournalLock
from gpuguard.actuator.safety.statewrites import StateWrites
from gpuguard.contract import TriggerSource
from gpuguard.web.webconfig import WebConfigCollector, WebConfigWatcher

log = logging.getLogger("gpuguard.actuator")

MAINTENANCE_PERIOD_S = 0.5


def claim_journal(state_dir: Path, writes: StateWrites | None = None) -> JournalLock:
    """Become the journal's one writer, waiting while another actuator or the guard is.

    Where there is no lock file to take (a read-only directory without one), it goes on
    without: its journal then writes nothing, and it pauses nothing, until it has the lock.
    """
    lock = JournalLock(state_dir, writes)
    try:
        if not lock.try_acquire():
            log.warning(
                "journal in %s is locked by process %s (another actuator, or the guard "
                "resuming what a dead one paused): waiting for it", state_dir, lock.holder(),
            )  # fmt: skip
            lock.acquire()
    except OSError as exc:
        log.error("cannot lock %s: pausing nothing, and writing nothing, until it can", lock.path)
        lock.writes.failed("lock", lock.path, exc)
    lease.renew_actuator(state_dir, writes)
    return lock


def open_journal(
    state_dir: Path, writes: StateWrites | None = None, lock: JournalLock | None = None
) -> tuple[Journal, str | None]:
    """The journal, and why every managed pause must be undone (or None).

    A journal that cannot be read, or holds an entry that is not valid, is moved aside for
    the operator (at its first write, where the directory cannot be written now); its valid
    part is kept, and the loss is recorded in the new journal, so the undoing survives a
    restart until it is done.
    """
    try:
        journal = Journal(state_dir, writes=writes, lock=lock)
    except JournalCorrupt as exc:
        path = state_dir / JOURNAL_FILE
        aside_later = False
        try:
            kept = set_aside(path).name
        except OSError as err:  # a read-only directory: moved before the journal's first write
            kept, aside_later = f"{path.name} (not yet moved aside: {err.strerror})", True
        log.error(
            "JOURNAL UNREADABLE: %s. Kept as %s for inspection. Which containers this "
            "actuator paused is unknown: every paused container labelled gpuguard.managed=true "
            "will be resumed as soon as Docker answers.", exc, kept,
        )  # fmt: skip
        journal = Journal(state_dir, exc.salvaged or JournalContent(), writes=writes, lock=lock)
        journal.set_aside_first = aside_later
        journal.set_lost(f"{exc}; kept as {kept}")
    return journal, journal.lost


def node_marker(config: Config, engine: ContainerEngine) -> NodeMarker | None:
    """This node's mark: a Swarm node label, or a Kubernetes taint and label; None where
    neither can be set (containerd and no Kubernetes: the node list alone)."""
    if config.node_marker == "kubernetes":
        server = config.kubernetes_api_server
        return TaintMarker(config.node_name, lambda: kubernetes_api(server))
    if not isinstance(engine, DockerEngine):
        return None  # no Swarm without Docker
    manager = DockerEngine(config.swarm_manager) if config.swarm_manager else engine
    return SwarmMarker(engine, manager)


def slo_signal_of(config: Config, metrics: ActuatorMetrics) -> SloSignal | None:
    """Rate control's poller of Prometheus, where it has one to poll."""
    if config.prometheus_url is None:
        law = config.policy.rate
        if law.max_slowdown:
            log.info(
                "best-effort rate control without --prometheus.url: no SLO signal; best-effort "
                "work runs beside active real-time work as much as its measured demand allows "
                "for a real-time slowdown of %g (--besteffort.max-slowdown), %.0f%% of each "
                "period until its demand is known (--besteffort.initial)",
                law.max_slowdown, 100 * law.initial,
            )  # fmt: skip
        else:
            log.info(
                "best-effort rate control without --prometheus.url: open loop, best-effort "
                "work runs %.0f%% of each period beside active real-time work "
                "(--besteffort.initial)",
                100 * law.initial,
            )
        return None
    return SloSignal(
        config.prometheus_url,
        config.node_name,
        config.policy.rate.stale_after_s,
        lambda result: metrics.slo_queries.labels(result).inc(),
        config.prometheus_client,
    )


def run(config: Config) -> int:
    """Start everything, serve until a signal, resume what we paused, exit."""
    flags.start_logging(config.log_level, config.warnings, "gpuguard.actuator")
    # Nothing written to the state directory is a reason to stop: what the journal names
    # must be resumed, even on a full or read-only disk (``statewrites``).
    writes = StateWrites()
    lock = claim_journal(config.state_dir, writes)
    journal, journal_lost = open_journal(config.state_dir, writes, lock)
    journal.max_pause_s = config.max_pause_s  # the guard enforces the same limit
    journal.save()
    audit = AuditLog(config.state_dir / AUDIT_FILE, writes)
    if journal_lost:
        audit.write("journal_unreadable", detail=journal_lost)
    engine = open_engine(config.docker_host, config.containerd_address, config.containerd_namespace)
    metrics = ActuatorMetrics(config.node_name, writes=writes)
    freezer = (
        None if config.pause_method == "docker" else ContainerFreezer(config.procfs, config.sysfs)
    )
    executor = PauseExecutor(engine, journal, audit, dry_run=config.dry_run, freezer=freezer)
    slo_signal = slo_signal_of(config, metrics)
    controller = Controller(
        config,
        lambda: ExporterClient(
            config.exporter_url, min(2.0, config.exporter_timeout_s), config.exporter_client
        ),
        executor,
        journal,
        audit,
        metrics,
        node_marker(config, engine),
        journal_lost,
        slo_signal,
    )
    _warn_without_guard(config.state_dir)
    try:
        web = None
        if config.web is not None:
            # without a token or --web.insecure, the web config is all that guards the webhook
            relied_on = config.token is None and not config.insecure
            web = WebConfigWatcher(config.web, require_auth=relied_on)
            metrics.registry.register(WebConfigCollector(web))
        address = (config.listen_host, config.listen_port)
        server = ActuatorServer(address, controller, config.token, web=web)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", config.listen_host, config.listen_port, exc)
        controller.resume_all("start-up failed", TriggerSource.RECONCILE)
        lock.release()
        return 1
    server.serve_in_thread()
    # Listening first: the engine may hang for its whole timeout, and /healthz should say so
    # meanwhile. Webhooks that come in the meantime wait for the controller's lock.
    _start_up_reconcile(controller)
    lease.renew_actuator(config.state_dir, writes)
    controller.start_timer()
    if slo_signal is not None:
        slo_signal.start()
    fast = None
    if config.mode in ("fast", "both"):
        fast = FastPath(
            controller, ExporterClient(config.exporter_url, 2.0, config.exporter_client)
        )
        fast.start()
    control = "rate"  # the audit's start record keeps its field (the retired hold: never)
    audit.write(
        "start", mode=config.mode, order=config.policy.order, best_effort_control=control,
        dry_run=config.dry_run,
    )  # fmt: skip
    log.info(
        "actuator on %s:%d (node %s, mode %s, order %s, best-effort control %s%s)",
        config.listen_host, server.server_address[1], config.node_name, config.mode,
        config.policy.order, control, ", dry run" if config.dry_run else "",
    )  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.is_set():
        started = time.monotonic()
        # The guard takes over when this lease is not renewed: a stuck loop counts as dead.
        lease.renew_actuator(config.state_dir, writes)
        metrics.guard_seen(lease.age(config.state_dir / lease.GUARD_LEASE))
        try:
            controller.maintain()
        except Exception:  # maintenance must go on
            log.exception("maintenance failed")
        stop.wait(max(0.0, MAINTENANCE_PERIOD_S - (time.monotonic() - started)))
    log.info("stopping: resuming every container this actuator paused")
    server.shutdown()
    if fast is not None:
        fast.stop()
    controller.timer.stop()
    if slo_signal is not None:
        slo_signal.stop()
    controller.resume_all("actuator stopping", TriggerSource.RECONCILE)
    audit.write("stop")
    audit.close()
    lock.release()
    return 0


def _warn_without_guard(state_dir: Path) -> None:
    if lease.age(state_dir / lease.GUARD_LEASE) > 10.0:
        log.warning(
            "no gpuguard guard renews %s: if this actuator dies, what it paused stays paused "
            "until it restarts. Run `gpuguard guard --state.dir=%s` beside it.",
            state_dir / lease.GUARD_LEASE, state_dir,
        )  # fmt: skip


def _start_up_reconcile(controller: Controller) -> None:
    """Settle what a previous run left: journal vs engine vs state, and the node label."""
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
