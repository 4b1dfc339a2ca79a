"""Node records from Prometheus: one instant query for every node's record series.

Why Prometheus and not the nodes themselves: it already scrapes every exporter (and every
actuator's mark), so the placer opens one connection, needs no credentials for a thousand
exporters and no fan-out with per-node timeouts; one query answers for the whole cluster.
Freshness is the scrape interval (1 s in the fast profile, 15 s by default), which the
placer covers by remembering its own recent placements (``reservations``); a record whose
poll is older than ``--records.max-age`` is shown but never chosen (``stale``). An exporter
that stops answering drops out: Prometheus marks its series stale at the failed scrape.
Prometheus down means no placement (503) rather than placement on old data.

Values from Prometheus are checked here, at the placer's boundary (``_valid``): an exporter
can publish NaN or an infinity (a division by zero upstream, a bug, a hand-made series), and
before, one such GPU made every placement and node list of the cluster answer 500. A GPU
whose record holds one is shown with ``invalid_record`` and never chosen; a malformed sample
is skipped; a node mark that is neither 0 nor 1 counts as marked.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuguard.contract import StateReason
from gpuguard.noderecord import MEMORY_MAX, GpuRecord, NodeRecord
from gpuguard.placer.errors import RecordsUnavailable
from gpuguard.placer.ranking import NodeView
from gpuguard.promquery import QueryFailed, instant_query
from gpuguard.web import client
from gpuguard.web.client import ClientConfig

log = logging.getLogger(__name__)

#: The record's per-GPU series the placer ranks on (``gpuguard_gpu_<field>``).
_GPU_FIELDS = (
    "info",
    "state",
    "float_time_seconds",
    "free_memory_bytes",
    "memory_total_bytes",
    "busy_ratio",
    "running_tasks",
)
LAST_POLL = "gpuguard_exporter_last_poll_timestamp_seconds"
PROVISIONABLE = "gpuguard_actuator_node_provisionable"
STATE_REASON = "gpuguard_gpu_state_reason"
#: The placer's only query: every series a record is made of, and only the reasons that
#: hold (a comparison keeps the metric name; ``or`` adds them, as their label sets differ).
#: ``max by`` drops the target labels (a third of the reply at 1,000 nodes) and merges a node
#: scraped twice.
RECORDS_QUERY = (
    'max by (__name__, node, gpu, name) ({__name__=~"gpuguard_gpu_('
    + "|".join(_GPU_FIELDS)
    + f')|{LAST_POLL}|{PROVISIONABLE}"}})'
    f" or max by (__name__, node, gpu, reason) ({STATE_REASON} == 1)"
)
_STATE_REASONS = {str(r): r for r in StateReason}
_REASON_ORDER = tuple(StateReason)
_FIELD_OF = {f"gpuguard_gpu_{name}": name for name in _GPU_FIELDS}
_MAX_TASKS = 1_000_000


def _valid(field_name: str, value: float) -> bool:
    """Whether a record field's value can be ranked on (the exporter's range for it)."""
    if field_name == "state":
        return value in (0.0, 1.0)
    if field_name == "float_time_seconds":
        return not math.isnan(value) and value != -math.inf  # +Inf: no deadline in the window
    if not math.isfinite(value) or value < 0:
        return False
    if field_name in ("free_memory_bytes", "memory_total_bytes"):
        return value <= MEMORY_MAX
    if field_name == "running_tasks":
        return value <= _MAX_TASKS
    if field_name == "busy_ratio":
        return value <= 1.0
    return True


def _parse(sample: Any) -> tuple[Mapping[str, str], float] | None:
    """A sample's labels and value, or None when it is not a Prometheus vector sample."""
    try:
        labels = sample["metric"]
        value = float(sample["value"][1])
    except (TypeError, KeyError, IndexError, ValueError):
        return None
    return (labels, value) if isinstance(labels, dict) else None


@dataclass
class _Node:
    timestamp: float | None = None
    marked: bool = False
    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)
    invalid: set[str] = field(default_factory=set)


def views_from_samples(samples: Iterable[Mapping[str, Any]], now: float) -> list[NodeView]:
    """Node views from the ``result`` of ``RECORDS_QUERY`` (pure).

    A GPU needs its state, free and total memory; a node needs its exporter's poll time.
    Anything else missing takes a neutral value (no reason, no task, no slack).
    """
    nodes: dict[str, _Node] = {}
    for sample in samples:
        parsed = _parse(sample)
        if parsed is None:
            continue
        labels, value = parsed
        node_name = labels.get("node")
        if not node_name or not isinstance(node_name, str):
            continue
        name = labels.get("__name__", "")
        node = nodes.get(node_name)
        if node is None:
            node = nodes[node_name] = _Node()
        gpu = labels.get("gpu")
        if gpu is not None:
            fields = node.gpus.get(gpu)
            if fields is None:
                fields = node.gpus[gpu] = {}
            field_name = _FIELD_OF.get(name)
            if field_name == "info":
                fields["model"] = str(labels.get("name", ""))
            elif field_name is not None and not _valid(field_name, value):
                node.invalid.add(gpu)
            elif field_name is not None:
                fields[field_name] = value
            elif name == STATE_REASON:
                reason = _STATE_REASONS.get(labels.get("reason", ""))
                if value == 1 and reason is not None:
                    fields.setdefault("reasons", set()).add(reason)
        elif name == LAST_POLL and math.isfinite(value) and value > 0:
            node.timestamp = max(value, node.timestamp or 0.0)
        elif name == PROVISIONABLE:
            node.marked = node.marked or value != 1  # 0, or anything that is not a 0 or 1
    views = []
    for node_name, node in sorted(nodes.items()):
        if node.timestamp is None:
            continue  # an actuator's mark without an exporter: no record
        gpus = tuple(
            record
            for key, fields in sorted(node.gpus.items())
            if key not in node.invalid and (record := _gpu(key, fields))
        )
        age = max(0.0, now - node.timestamp)
        node_record = NodeRecord(node_name, node.timestamp, gpus)
        views.append(NodeView(node_record, age, node.marked, tuple(sorted(node.invalid))))
    return views


def _gpu(key: str, fields: Mapping[str, Any]) -> GpuRecord | None:
    if not {"state", "free_memory_bytes", "memory_total_bytes"} <= set(fields):
        return None
    reasons = fields.get("reasons")
    return GpuRecord(
        gpu=key,
        model=fields.get("model", ""),
        state=int(fields["state"]),
        reasons=tuple(r for r in _REASON_ORDER if r in reasons) if reasons else (),
        float_time_s=fields.get("float_time_seconds", math.inf),
        deadline_tasks=0,  # not queried: the ranking does not use them
        recent_misses=0,
        running_tasks=int(fields.get("running_tasks", 0)),
        min_slack_s=None,
        busy_ratio=fields.get("busy_ratio", 0.0),
        memory_free_bytes=int(fields["free_memory_bytes"]),
        memory_total_bytes=int(fields["memory_total_bytes"]),
    )


@dataclass
class _Flight:
    """One records query under way: whoever asks meanwhile waits for it, not for a new one."""

    done: threading.Event = field(default_factory=threading.Event)
    samples: list[Mapping[str, Any]] | None = None
    error: str = ""


class PrometheusSource:
    """Reads every node's record with one query, reused for ``cache_s`` seconds from when its
    reply arrived. Callers that ask while a query is under way share it; each waits at most
    ``timeout_s`` for the whole answer (connect, head and body), else RecordsUnavailable."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 5.0,
        cache_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        tls_auth: ClientConfig = client.NONE,
    ) -> None:
        self.base_url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self._clock = clock
        self._session = tls_auth.session()  # --prometheus.http-config-file
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Mapping[str, Any]]] | None = None
        self._flight: _Flight | None = None
        self._thread: threading.Thread | None = None

    def views(self) -> list[NodeView]:
        """Every node's view now; RecordsUnavailable when Prometheus cannot answer in time."""
        samples = self._samples(time.monotonic() + self.timeout_s)
        return views_from_samples(samples, self._clock())

    def _samples(self, deadline: float) -> list[Mapping[str, Any]]:
        with self._lock:
            if self._cached is not None and self._clock() - self._cached[0] <= self.cache_s:
                return self._cached[1]
            flight = self._flight
            if flight is None:
                flight = self._flight = _Flight()
                self._thread = threading.Thread(
                    target=self._query, args=(flight,), name="placer-records", daemon=True
                )
                self._thread.start()
        if not flight.done.wait(max(0.0, deadline - time.monotonic())):
            raise RecordsUnavailable(
                f"prometheus at {self.base_url}/api/v1/query: no whole answer within "
                f"{self.timeout_s:g}s"
            )
        if flight.samples is None:
            raise RecordsUnavailable(flight.error or f"prometheus at {self.base_url}: failed")
        return flight.samples

    def _query(self, flight: _Flight) -> None:
        """Run one query for ``flight``; its reply is cached from when it arrived."""
        try:
            flight.samples = instant_query(
                self._session, self.base_url, RECORDS_QUERY, self.timeout_s
            )
        except QueryFailed as exc:
            flight.error = str(exc)
        finally:
            with self._lock:
                if flight.samples is not None:
                    self._cached = (self._clock(), flight.samples)
                self._flight = None
            flight.done.set()

    def close(self) -> None:
        """Wait for a query under way (it ends by its own deadline), then close the session."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout=2 * self.timeout_s + 1)
        self._session.close()
