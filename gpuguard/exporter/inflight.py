"""Servers' own in-flight gauges, read by the exporter every 100 ms (``gpuguard/inflight.py``).

``GaugeReader.run`` reads, for each running container that declares a gauge, its
``http://<host>:<port>/metrics`` (``--gauge.host``, default 127.0.0.1: containers on the
host's network, as the tenants' scrape job reaches them), bounded in time (``TIMEOUT_S`` a
request) and size (``MAX_BYTES``; a larger answer is an error, not read on). A value above 0
is a request in flight: the container turns busy, and back to idle at 0, each edge on the
event stream (``gpu_busy``/``gpu_idle`` with ``source: gauge``), timed at the read, unless
the launch probe sees the container (``probed``): its edges are then the probe's.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpuguard.contract import ActivitySource, EventType
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.model import ContainerInfo
from gpuguard.inflight import InflightDeclaration, gauge_value

INTERVAL_S = 0.1
TIMEOUT_S = 0.05
MAX_BYTES = 256 * 1024
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GaugeReading:
    """A container's gauge at its last read: the value, or why there is none."""

    value: float | None
    timestamp: float
    error: str | None = None
    busy_since: float | None = None


class GaugeError(Exception):
    """The gauge could not be read (one line: why)."""


def read_gauge(host: str, declared: InflightDeclaration, timeout_s: float = TIMEOUT_S) -> float:
    """The declared gauge's value from one GET of /metrics; raises ``GaugeError``."""
    connection = http.client.HTTPConnection(host, declared.port, timeout=timeout_s)
    try:
        connection.request("GET", "/metrics", headers={"Accept": "text/plain"})
        reply = connection.getresponse()
        if reply.status != 200:
            raise GaugeError(f"GET /metrics answered {reply.status}")
        body = reply.read(MAX_BYTES + 1)
        if len(body) > MAX_BYTES:
            raise GaugeError(f"/metrics is larger than {MAX_BYTES} bytes")
    except (OSError, http.client.HTTPException) as exc:
        raise GaugeError(f"cannot read {host}:{declared.port}/metrics: {exc}") from None
    finally:
        connection.close()
    value = gauge_value(body.decode("utf-8", "replace"), declared.series_name)
    if value is None:
        raise GaugeError(f"no {declared.metric} in {host}:{declared.port}/metrics")
    return value


class GaugeReader:
    """Reads every declared gauge once per ``interval_s``; thread-safe ``view``."""

    def __init__(
        self,
        containers: Callable[[], Mapping[str, ContainerInfo]],
        events: EventLog,
        host: str = "127.0.0.1",
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.time,
        probed: Callable[[str], bool] = lambda _cid: False,
    ) -> None:
        self._containers = containers
        self._probed = probed
        self._events = events
        self.host = host
        self.interval_s = interval_s
        self._clock = clock
        self._view: Mapping[str, GaugeReading] = MappingProxyType({})
        self._pending: list[tuple[EventType, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def read_once(self) -> None:
        """One round over the containers that declare a gauge."""
        previous = self.view()
        readings: dict[str, GaugeReading] = {}
        for info in self._containers().values():
            if info.inflight is None or info.state != "running":
                continue
            before = previous.get(info.id)
            try:
                value = read_gauge(self.host, info.inflight)
            except GaugeError as exc:
                if info.id not in self._warned:  # once per container, as label errors
                    self._warned.add(info.id)
                    log.warning("container %s: in-flight gauge: %s", info.name, exc)
                since = before.busy_since if before is not None else None
                readings[info.id] = GaugeReading(None, self._clock(), str(exc), since)
                continue
            now = self._clock()
            since = before.busy_since if before is not None else None
            if value > 0 and since is None:
                since = now
                self._emit(EventType.GPU_BUSY, info, now)
            elif value <= 0 and since is not None:
                self._emit(EventType.GPU_IDLE, info, now, busy_since=since, run_s=now - since)
                since = None
            readings[info.id] = GaugeReading(value, now, None, since)
        with self._lock:
            self._view = MappingProxyType(readings)
        # edges go out once the view shows them: a state read after an edge reflects it
        pending, self._pending = self._pending, []
        for type_, fields in pending:
            self._events.append(type_, **fields)

    def _emit(self, type_: EventType, info: ContainerInfo, ts: float, **fields: float) -> None:
        if self._probed(info.id):
            return  # the launch probe sees it call the driver: its edges are the exact ones
        self._pending.append((type_, {
            "ts": ts, "container_id": info.id, "container": info.name,
            "source": ActivitySource.GAUGE.value, **fields,
        }))  # fmt: skip

    def view(self) -> Mapping[str, GaugeReading]:
        """The last reading of each container that declares a gauge."""
        with self._lock:
            return self._view

    def run(self, stop: threading.Event) -> None:
        """Read every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            started = time.monotonic()
            self.read_once()
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
