"""Labels gpuguard reads and writes, and parsing of their values (pure).

Container labels (what a tenant sets on its container), and the Swarm node and service
labels that the actuator's node marks and ``gpuguard run``'s placed services share.
"""

from __future__ import annotations

import math
import re
from typing import TypeVar

from gpuguard import units
from gpuguard.contract import PriorityClass, TaskMode

DEADLINE = "gpuguard.deadline"
MANAGED = "gpuguard.managed"
ROLE = "gpuguard.role"
TASK = "gpuguard.task"
CLASS = "gpuguard.class"
#: a latency objective from the tenant's own histogram (gpuguard/slo.py)
SLO_METRIC = "gpuguard.slo.metric"
SLO_TARGET = "gpuguard.slo.target"
SLO_OBJECTIVE = "gpuguard.slo.objective"
SLO_PORT = "gpuguard.slo.port"
SLO_LABELS = (SLO_METRIC, SLO_TARGET, SLO_OBJECTIVE, SLO_PORT)
#: Pod labels or annotations only the placer's kube-scheduler extender reads (with
#: ``gpuguard.deadline``): the GPU memory a pod needs and one task's run time alone, as the
#: placer's ``memory`` and ``runtime`` parameters are written (``4GiB``, ``1500ms``).
PLACEMENT_MEMORY = "gpuguard.memory"
PLACEMENT_RUNTIME = "gpuguard.runtime"
#: pod label (Kubernetes): the one container of the pod that the pod's other gpuguard labels
#: are for; absent, every container of the pod has them (gpuguard/kube.py)
CONTAINER = "gpuguard.container"

#: Swarm node label: ``false`` while the node's actuator marks it unprovisionable; a
#: real-time service carries the constraint ``node.labels.gpuguard.provisionable!=false``.
PROVISIONABLE = "gpuguard.provisionable"
#: Swarm node label: the node's name as its exporter knows it (``--node.name``).
NODE = "gpuguard.node"
#: Swarm service label: ``<node>/<gpu>`` the placer chose for the service.
PLACEMENT = "gpuguard.placement"

_E = TypeVar("_E", TaskMode, PriorityClass)

_ASCII_DIGITS = re.compile(r"[0-9]+")
# Prometheus' metric name syntax; a histogram's series add _bucket, _count and _sum.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
_METRIC_NAME_MAX = 200
_OBJECTIVE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(%?)\s*$")
GPU_INDEX_DIGITS = 6


class LabelError(ValueError):
    """A label value that cannot be understood."""


def parse_duration(text: str) -> float:
    """Seconds (> 0) from a duration as labels write it (``gpuguard/units.py``): a Go
    duration (``9s``, ``1500ms``, ``1m30s``) or a bare number of seconds (``9``, ``0.5``).

    >>> parse_duration("1500ms")
    1.5
    """
    try:
        return units.parse_duration(text, bare_seconds=True)
    except units.UnitError as exc:
        raise LabelError(str(exc)) from None


def parse_managed(value: str | None) -> bool:
    """Only the exact (case-insensitive) value ``true`` makes a container managed."""
    return value is not None and value.strip().lower() == "true"


def parse_task_mode(text: str) -> TaskMode:
    """``process``, ``memory`` or ``burst`` (exactly, lower case) into a TaskMode."""
    return _choice(text, TaskMode, TASK)


def parse_priority_class(text: str) -> PriorityClass:
    """``real-time``, ``normal`` or ``best-effort`` (exactly, lower case) into a PriorityClass."""
    return _choice(text, PriorityClass, CLASS)


def _choice(text: str, enum: type[_E], label: str) -> _E:
    # Exact values only: "Burst" or "besteffort" would be a silent typo in a policy input.
    if not isinstance(text, str) or text not in set(enum):
        known = ", ".join(e.value for e in enum)
        raise LabelError(f"invalid {label} {text!r}: use one of {known}")
    return enum(text)


def format_duration(seconds: float) -> str:
    """Format seconds the way ``parse_duration`` reads them back (``units.format_duration``)."""
    return units.format_duration(seconds)


def ascii_int(text: str, max_digits: int) -> int:
    """A non-negative integer of ASCII digits only, at most ``max_digits`` long.

    ``str.isdigit`` and ``int`` accept ``²`` or Arabic-Indic digits, and ``int`` refuses
    5,000 digits with an error of its own: both made servers drop the connection.
    """
    if len(text) > max_digits or not _ASCII_DIGITS.fullmatch(text):
        raise LabelError(f"not an integer of at most {max_digits} ASCII digits: {text[:40]!r}")
    return int(text)


def parse_gpu(text: str) -> int:
    """A ``gpu`` label as gpuguard writes it: ``0``, or ``0:1`` on a MIG device (-> 0)."""
    parent, colon, mig = text.partition(":")
    try:
        index = ascii_int(parent, GPU_INDEX_DIGITS)
        if colon:
            ascii_int(mig, GPU_INDEX_DIGITS)
    except LabelError:
        raise LabelError(f"gpu must be an index like 0 or 0:1, got {text[:40]!r}") from None
    return index


def parse_slo_metric(text: str) -> str:
    """The name of a tenant's latency histogram: a Prometheus metric name without the
    ``_bucket``/``_count``/``_sum`` suffix, documented with ``_`` for ``:``
    (``vllm_e2e_request_latency_seconds``, valid as a Kubernetes label value) and accepted
    with its ``:`` too (``vllm:e2e_request_latency_seconds``): the same series either way."""
    if not isinstance(text, str) or not _METRIC_NAME.fullmatch(text.strip()):
        raise LabelError(
            f"invalid {SLO_METRIC} {str(text)[:40]!r}: not a Prometheus metric name "
            "(letters, digits, _ and :, not starting with a digit)"
        )
    name = text.strip()
    if len(name) > _METRIC_NAME_MAX:
        raise LabelError(f"invalid {SLO_METRIC}: longer than {_METRIC_NAME_MAX} characters")
    for suffix in _HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            raise LabelError(
                f"invalid {SLO_METRIC} {name[:40]!r}: give the histogram's own name, "
                f"without {suffix} ({name[: -len(suffix)][:40]})"
            )
    return name


def parse_slo_objective(text: str) -> float:
    """The share of requests that must meet the target: ``0.99`` or ``99%`` (0 < x < 1)."""
    match = _OBJECTIVE.match(text) if isinstance(text, str) else None
    value = float(match.group(1)) / (100.0 if match.group(2) else 1.0) if match else math.nan
    if not 0.0 < value < 1.0:
        raise LabelError(
            f"invalid {SLO_OBJECTIVE} {str(text)[:40]!r}: a share of requests between 0 and 1 "
            "exclusive, e.g. 0.99 or 99%"
        )
    return value


def parse_port(text: str) -> int:
    """A TCP port, 1 to 65535 (``gpuguard.slo.port``: where the tenant serves /metrics)."""
    try:
        port = ascii_int(text.strip() if isinstance(text, str) else "", 5)
    except LabelError:
        port = 0
    if not 1 <= port <= 65535:
        raise LabelError(f"invalid {SLO_PORT} {str(text)[:40]!r}: a TCP port, 1 to 65535")
    return port
