"""A server's own gauge of requests in flight, declared by labels, and read from its
/metrics text (pure).

A server that already publishes how many requests it is serving (vLLM's
``vllm:num_requests_running``, Triton's ``nv_inference_pending_request_count``, TGI's
``tgi_batch_current_size``) declares it::

    gpuguard.inflight.metric=vllm_num_requests_running   # or with its ':'
    gpuguard.inflight.port=8000     # where it serves /metrics (default: gpuguard.slo.port)

The exporter then reads it itself (``gpuguard/exporter/inflight.py``): a value above 0 is a request
being served. ``:`` and ``_`` spellings name the same series, as for ``gpuguard.slo.metric``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuguard import labels
from gpuguard.labels import LabelError

INFLIGHT_METRIC = "gpuguard.inflight.metric"
INFLIGHT_PORT = "gpuguard.inflight.port"
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,199}")
#: a sample line: name, optional {labels}, value (timestamps and exemplars ignored)
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True, slots=True)
class InflightDeclaration:
    """Which gauge counts a container's requests in flight, and where it is served."""

    metric: str
    port: int

    @property
    def series_name(self) -> str:
        """The name with ``_`` for ``:``: a sample matches when its name reads the same so."""
        return self.metric.replace(":", "_")


def declaration(
    container_labels: Mapping[str, str],
) -> tuple[InflightDeclaration | None, tuple[tuple[str, str], ...]]:
    """The gauge a container's labels declare, and (label, error) for each label that
    cannot be used; never raises. Without a port (its own or ``gpuguard.slo.port``) there is
    nothing to read, and ``gpuguard.inflight.metric`` is reported."""
    metric = container_labels.get(INFLIGHT_METRIC)
    if metric is None:
        return None, ()
    errors: list[tuple[str, str]] = []
    if not isinstance(metric, str) or not _NAME.fullmatch(metric.strip()):
        why = f"invalid {INFLIGHT_METRIC} {str(metric)[:40]!r}: not a Prometheus metric name"
        return None, ((INFLIGHT_METRIC, why),)
    port = None
    for name in (INFLIGHT_PORT, labels.SLO_PORT):
        raw = container_labels.get(name)
        if raw is None:
            continue
        try:
            port = labels.parse_port(raw)
            break
        except LabelError:
            errors.append((name, f"invalid {name} {str(raw)[:40]!r}: a TCP port, 1 to 65535"))
    if port is None:
        errors.append((INFLIGHT_METRIC, f"{INFLIGHT_METRIC} needs {INFLIGHT_PORT} or a valid "
                                        f"{labels.SLO_PORT}"))  # fmt: skip
        return None, tuple(errors)
    return InflightDeclaration(metric.strip(), port), tuple(errors)


def gauge_value(text: str, series_name: str) -> float | None:
    """The sum of the samples whose name, ``:`` read as ``_``, is ``series_name`` in
    Prometheus text, or None when there is none (a value that is not a number is skipped)."""
    total: float | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None or match.group(1).replace(":", "_") != series_name:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        total = value if total is None else total + value
    return total
