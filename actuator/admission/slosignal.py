"""The rate controller's signal: each real-time container's SLO attainment per GPU, from
Prometheus, polled in a thread of its own.

Why: docs/design-notes.md, "Rate control's SLO signal".
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuguard.actuator.admission.pressure import SHORT_ID, device_of
from gpuguard.actuator.admission.ratecontrol import SloReading
from gpuguard.actuator.metrics import QUERY_FAILED, QUERY_OK
from gpuguard.actuator.state import DeviceKey, ExporterState
from gpuguard.contract import PriorityClass
from gpuguard.promquery import QueryFailed, instant_query, label_value
from gpuguard.web import client
from gpuguard.web.client import ClientConfig

log = logging.getLogger("gpuguard.actuator")

ATTAINMENT_RULE = "gpuguard:container_gpu_slo_attainment_ratio:10s"
#: how often the poller asks (the fast profile evaluates rules every second)
POLL_S = 1.0
TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Attainment:
    """One container's attainment on one device, as Prometheus last evaluated it."""

    container_id: str  # the short id (12 hex), as the rules carry it
    device: DeviceKey
    ratio: float
    evaluated_at: float


def attainment_query(node: str, range_s: float) -> str:
    """This node's per-GPU attainment samples over the last ``range_s`` (a range vector)."""
    return f"{ATTAINMENT_RULE}{{node={label_value(node)}}}[{max(1, math.ceil(range_s))}s]"


def attainments_from_result(result: Iterable[Mapping[str, Any]]) -> list[Attainment]:
    """The newest sample of each series of a range query's result (pure).

    A series without a container id or a ``gpu`` label gpuguard writes, or whose newest
    value is no share, is skipped: one malformed series never hides the others.
    """
    out = []
    for series in result:
        try:
            labels, values = series["metric"], series["values"]
            when, text = values[-1]
            ratio, when = float(text), float(when)
            device = device_of(labels)
        except (TypeError, KeyError, IndexError, ValueError):
            continue
        cid = labels.get("container_id")
        valid = isinstance(cid, str) and len(cid) == SHORT_ID and device is not None
        if valid and 0 <= ratio <= 1 and math.isfinite(when):
            assert device is not None
            out.append(Attainment(cid, device, ratio, when))
    return out


def device_readings(
    state: ExporterState, attainments: Iterable[Attainment]
) -> tuple[dict[DeviceKey, list[SloReading]], frozenset[DeviceKey]]:
    """Each device's SLO readings, and the devices where a real-time container declares an
    SLO (pure): on a device it runs a task on now, or one Prometheus last saw it on.

    Only real-time containers the state still holds count; the objective is the state's.
    """
    declaring = {
        c.id[:SHORT_ID]: c.slo_objective
        for c in state.containers
        if c.priority_class == PriorityClass.REAL_TIME and c.slo_objective is not None
    }
    full = {c.id: c.id[:SHORT_ID] for c in state.containers}
    declared = {t.device for t in state.tasks if full.get(t.container_id or "") in declaring}
    readings: dict[DeviceKey, list[SloReading]] = {}
    for a in attainments:
        objective = declaring.get(a.container_id)
        if objective is None:
            continue
        declared.add(a.device)
        readings.setdefault(a.device, []).append(SloReading(a.ratio, objective, a.evaluated_at))
    return readings, frozenset(declared)


class SloSignal:
    """Polls Prometheus for this node's attainments, every ``POLL_S`` in a daemon thread."""

    def __init__(
        self,
        url: str,
        node: str,
        range_s: float,
        on_query: Callable[[str], None],
        tls_auth: ClientConfig = client.NONE,
        poll_s: float = POLL_S,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        """``on_query(result)`` is told how each query went (``metrics.QUERY_RESULTS``)."""
        self.url = url
        self.query = attainment_query(node, range_s)
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self._on_query = on_query
        self._session = tls_auth.session()
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, DeviceKey], Attainment] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slo-signal", daemon=True)
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout_s + 1)
        self._session.close()

    def latest(self) -> list[Attainment]:
        """The newest attainment of every (container, device) seen; old ones age in place
        (the law ignores them once stale)."""
        with self._lock:
            return list(self._latest.values())

    def poll(self) -> bool:
        """One query; True when Prometheus answered."""
        try:
            result = instant_query(self._session, self.url, self.query, self.timeout_s)
        except QueryFailed as exc:
            if self.last_error is None:
                log.warning("SLO signal: %s (readings age until it answers)", exc)
            self.last_error = str(exc)
            self._on_query(QUERY_FAILED)
            return False
        if self.last_error is not None:
            log.info("SLO signal: prometheus answers again")
        self.last_error = None
        fresh = {(a.container_id, a.device): a for a in attainments_from_result(result)}
        with self._lock:
            # a series Prometheus no longer returns keeps its last reading, which ages
            self._latest.update(fresh)
            if len(self._latest) > 4096:  # containers long gone: keep the newest
                newest = sorted(self._latest.items(), key=lambda kv: -kv[1].evaluated_at)
                self._latest = dict(newest[:1024])
        self._on_query(QUERY_OK)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.poll()
            except Exception:  # the poller must go on: a failure only ages the readings
                log.exception("SLO signal poll failed")
            self._stop.wait(max(0.0, self.poll_s - (time.monotonic() - started)))
