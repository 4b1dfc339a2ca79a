"""A container's latency objective, declared by labels over its own latency histogram (pure).

``declaration`` reads ``gpuguard.slo.metric``, ``.target``, ``.objective`` and ``.port``
into an ``SloDeclaration`` and a (label, error) for each label it cannot use. The metric
is named with ``_`` for ``:`` (``series_name``; the colon form declares the same SLO); its
unit is seconds unless the name says ``_ms``/``_milliseconds`` or ``_us``/``_microseconds``;
the target must be one of the histogram's bucket bounds, and ``le_spellings`` lists each
way client libraries write it so the rules can join on the tenant's. Which servers' metrics
can be declared, and how the rules count them: docs/operator-reference.md, "Latency SLOs
from the tenants' own metrics".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpuguard import labels
from gpuguard.labels import LabelError

DEFAULT_OBJECTIVE = 0.99
#: metric name suffix -> how many of the histogram's units make one second
_UNITS = (
    ("_milliseconds", 1e3),
    ("_ms", 1e3),
    ("_microseconds", 1e6),
    ("_us", 1e6),
)


@dataclass(frozen=True, slots=True)
class SloDeclaration:
    """What a container promises about its requests' latency."""

    metric: str
    target_s: float
    objective: float = DEFAULT_OBJECTIVE
    port: int | None = None

    @property
    def series_name(self) -> str:
        """The name as the rules match it: ``:`` written ``_``.

        prometheus_client escapes ``:`` to ``_`` when Prometheus negotiates OpenMetrics
        (``escaping=underscores``; prometheus/client_python#1177), so a vLLM histogram may reach
        Prometheus as ``vllm_e2e_request_latency_seconds`` or with its colon, by client and
        server version. The tenants' scrape job writes its ``metric`` label this way too.
        """
        return self.metric.replace(":", "_")

    @property
    def per_second(self) -> float:
        """The histogram's units in one second (1 for seconds, 1000 for ``_ms``)."""
        return unit_per_second(self.metric)

    @property
    def bucket_bounds(self) -> tuple[str, ...]:
        """The ``le`` label values the target's bucket may carry (see ``le_spellings``)."""
        # 0.7 s is 700.0000000000001 ms in binary floating point: round to 12 digits.
        return le_spellings(float(f"{self.target_s * self.per_second:.12g}"))


def unit_per_second(metric: str) -> float:
    """From the name, Prometheus' convention: base unit seconds unless it says otherwise."""
    for suffix, factor in _UNITS:
        if metric.endswith(suffix):
            return factor
    return 1.0


def le_spellings(bound: float) -> tuple[str, ...]:
    """The ways client libraries write a bucket's upper bound ``bound`` in ``le``.

    Prometheus 2 stores ``le`` as the text the target wrote, and libraries differ:
    prometheus_client (vLLM) writes ``1.0``, client_golang ``1`` and ``1e+06``,
    Prometheus 3 and OpenMetrics ``1.0`` and ``1e+06``. A rule can only match label
    values exactly, so the exporter lists each spelling and the rule's join keeps the one
    the tenant wrote.
    """
    if not math.isfinite(bound) or bound <= 0:
        return ()
    python = repr(float(bound))  # shortest round trip: 0.5, 1.0, 1000000.0, 1e-05
    go = _go_shortest(bound)  # strconv.FormatFloat(b, 'g', -1, 64): 0.5, 1, 1e+06
    openmetrics = go if any(c in go for c in ".e") else go + ".0"
    spellings = [python, go, openmetrics]
    if float(bound).is_integer() and bound < 1e21:
        spellings.append(str(int(bound)))  # 1000000 (C++ and Rust encoders)
    spellings.append(f"{bound:g}")  # printf %g, six digits
    return tuple(dict.fromkeys(spellings))


def _go_shortest(value: float) -> str:
    """Go's ``strconv.FormatFloat(value, 'g', -1, 64)``: the shortest digits that read back
    as ``value``, in exponent form when the exponent is below -4 or at least 6."""
    sign, digit_tuple, exponent = Decimal(repr(float(value))).normalize().as_tuple()
    assert isinstance(exponent, int)  # finite
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent  # where the decimal point goes, from the left
    power = point - 1
    if power < -4 or power >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        text = f"{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
    elif point <= 0:
        text = "0." + "0" * -point + digits
    elif point >= len(digits):
        text = digits + "0" * (point - len(digits))
    else:
        text = digits[:point] + "." + digits[point:]
    return ("-" if sign else "") + text


def declaration(
    container_labels: Mapping[str, str],
) -> tuple[SloDeclaration | None, tuple[tuple[str, str], ...]]:
    """The SLO a container's labels declare, and (label, error) for each label that cannot
    be used; never raises.

    Each invalid label counts as absent, as for every other gpuguard label: an invalid
    objective falls back to 0.99, an invalid port to none. ``metric`` and ``target`` make
    the SLO; one without the other is reported on the missing label.
    """
    errors: list[tuple[str, str]] = []

    def parsed(name: str, parse: Callable[[str], Any]) -> Any:
        raw = container_labels.get(name)
        if raw is None:
            return None
        try:
            return parse(raw)
        except LabelError as exc:
            text = str(exc)
            errors.append((name, text if name in text else f"{name}: {text}"))
            return None

    metric = parsed(labels.SLO_METRIC, labels.parse_slo_metric)
    target = parsed(labels.SLO_TARGET, labels.parse_duration)
    objective = parsed(labels.SLO_OBJECTIVE, labels.parse_slo_objective)
    port = parsed(labels.SLO_PORT, labels.parse_port)
    given = sorted(name for name in labels.SLO_LABELS if name in container_labels)
    for required in (labels.SLO_METRIC, labels.SLO_TARGET):
        if given and required not in given:
            errors.append((required, f"{required} is required with {', '.join(given)}"))
    if not isinstance(metric, str) or not isinstance(target, float):
        return None, tuple(errors)
    slo = SloDeclaration(
        metric=metric,
        target_s=float(f"{target:.12g}"),  # 700ms: 0.7, not 0.7000000000000001
        objective=objective if isinstance(objective, float) else DEFAULT_OBJECTIVE,
        port=port if isinstance(port, int) else None,
    )
    return slo, tuple(errors)
