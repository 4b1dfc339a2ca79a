"""Rank nodes and GPUs for a new real-time container: paper C's node list, and gpuguard's.

``rank`` is pure: node records and a ``Request`` in, a ``Ranking`` (ranked candidates,
each with its reasons) out; nothing here knows Swarm, HTTP or Prometheus (docs/interfaces.md
§9). ``paper-c`` is paper C's Algorithm 2 and answers a node (its GPU with the most free
memory). ``gpuguard`` ranks GPUs: state 0 is a hard no; it counts its own placements the
records do not show yet (``Pending``), keeps ``headroom`` of memory free after the
request, orders by fewest sharers (the contention curve, ``gpuguard/slowdown.py``), then
least busy, then most free memory, and with ``runtime_s`` passes over GPUs where the
newcomer is predicted to miss. Float time is reported, never a filter. Why, and what
``bench/placement.py`` measured: docs/operator-reference.md, "Placer", and
docs/design-notes.md, "The placer's ranking".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuguard.contract import RankReason, StateReason
from gpuguard.noderecord import GpuRecord, NodeRecord
from gpuguard.slowdown import slowdown_factor

DEFAULT_HEADROOM = 0.05
DEFAULT_MAX_AGE_S = 30.0

Reason = StateReason | RankReason


class Policy(StrEnum):
    PAPER_C = "paper-c"
    GPUGUARD = "gpuguard"


@dataclass(frozen=True, slots=True)
class Request:
    """A new real-time container: its deadline, GPU memory, and optionally more."""

    deadline_s: float
    memory_bytes: int
    runtime_s: float | None = None  # one task's run time alone on the GPU, when known
    gpu_model: str | None = None  # only GPUs of this model (``gpuguard_gpu_info{name}``)


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the placer knows of one node: its record and how far to trust it."""

    record: NodeRecord
    age_s: float = 0.0  # now - the record's poll time
    marked: bool = False  # its actuator marks it unprovisionable
    #: GPUs whose record could not be used (a value NaN, infinite or out of range): shown,
    #: never chosen
    invalid_gpus: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Pending:
    """Placements on one GPU that its record does not show yet."""

    tasks: int = 0
    memory_bytes: int = 0


PendingMap = Mapping[tuple[str, str], Pending]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node (paper C) or GPU (gpuguard) in the ranked list, with why it may not be used."""

    node: str
    gpu: str | None
    model: str
    reasons: tuple[Reason, ...]
    memory_free_bytes: int  # less what is pending
    float_time_s: float
    running_tasks: int  # with what is pending
    busy_ratio: float
    slowdown: float | None = None  # contention model: newcomer's run time / alone
    predicted_s: float | None = None  # newcomer's predicted run time (runtime_s given)

    @property
    def eligible(self) -> bool:
        return not self.reasons

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpu": self.gpu,
            "model": self.model,
            "eligible": self.eligible,
            "reasons": [str(r) for r in self.reasons],
            "memory_free_bytes": self.memory_free_bytes,
            "float_time_s": self.float_time_s if math.isfinite(self.float_time_s) else None,
            "running_tasks": self.running_tasks,
            "busy_ratio": self.busy_ratio,
            "slowdown": self.slowdown,
            "predicted_s": self.predicted_s,
        }


@dataclass(frozen=True, slots=True)
class Ranking:
    """The ranked list: eligible candidates first, best first."""

    policy: Policy
    request: Request
    candidates: tuple[Candidate, ...] = field(default=())

    @property
    def choice(self) -> Candidate | None:
        first = self.candidates[0] if self.candidates else None
        return first if first is not None and first.eligible else None


def rank(
    views: Iterable[NodeView],
    request: Request,
    policy: Policy = Policy.GPUGUARD,
    pending: PendingMap | None = None,
    *,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    headroom: float = DEFAULT_HEADROOM,
) -> Ranking:
    """Rank every node (paper C) or GPU (gpuguard) for ``request``."""
    if policy is Policy.PAPER_C:
        keyed = [_paper_c(view, request, max_age_s) for view in views]
    else:
        keyed = [
            item
            for view in views
            for item in _gpuguard(view, request, pending or {}, max_age_s, headroom)
        ]
    keyed.sort(key=lambda item: (not item[1].eligible, item[0]))
    return Ranking(policy, request, tuple(candidate for _, candidate in keyed))


def _node_reasons(view: NodeView, max_age_s: float) -> list[Reason]:
    reasons: list[Reason] = []
    if view.age_s > max_age_s:
        reasons.append(RankReason.STALE)
    if view.marked:
        reasons.append(RankReason.MARKED)
    return reasons


def _paper_c(view: NodeView, request: Request, max_age_s: float) -> tuple[Any, Candidate]:
    record = view.record
    reasons = _node_reasons(view, max_age_s) + list(record.reasons)
    if view.invalid_gpus:  # its node-level summary would leave them out: not a whole record
        reasons.append(RankReason.INVALID_RECORD)
    if record.memory_free_bytes < request.memory_bytes:
        reasons.append(RankReason.MEMORY)
    if not record.float_time_s > request.deadline_s:
        reasons.append(RankReason.FLOAT_TIME)
    best = max(record.gpus, key=lambda g: g.memory_free_bytes, default=None)
    candidate = Candidate(
        node=record.node,
        gpu=best.gpu if best is not None else None,
        model=best.model if best is not None else "",
        reasons=tuple(reasons),
        memory_free_bytes=record.memory_free_bytes,
        float_time_s=record.float_time_s,
        running_tasks=sum(g.running_tasks for g in record.gpus),
        busy_ratio=max((g.busy_ratio for g in record.gpus), default=0.0),
    )
    return (-record.memory_free_bytes, record.node), candidate


def _gpuguard(
    view: NodeView, request: Request, pending: PendingMap, max_age_s: float, headroom: float
) -> list[tuple[Any, Candidate]]:
    record = view.record
    node_reasons = _node_reasons(view, max_age_s)
    invalid = [
        (
            (math.inf, 0.0, 0.0, record.node, gpu),
            Candidate(
                record.node, gpu, "", (*node_reasons, RankReason.INVALID_RECORD), 0, 0.0, 0, 0
            ),
        )
        for gpu in view.invalid_gpus
    ]
    if not record.gpus and not invalid:
        empty = Candidate(record.node, None, "", (*node_reasons, StateReason.NO_GPU), 0, 0.0, 0, 0)
        return [((math.inf, 0.0, 0.0, record.node, ""), empty)]
    return [
        _gpu_candidate(record.node, gpu, node_reasons, request, pending, headroom)
        for gpu in record.gpus
    ] + invalid


def _gpu_candidate(
    node: str,
    gpu: GpuRecord,
    node_reasons: list[Reason],
    request: Request,
    pending: PendingMap,
    headroom: float,
) -> tuple[Any, Candidate]:
    extra = pending.get((node, gpu.gpu), Pending())
    reasons: list[Reason] = [*node_reasons, *gpu.reasons]
    if request.gpu_model is not None and gpu.model != request.gpu_model:
        reasons.append(RankReason.GPU_MODEL)
    free = gpu.memory_free_bytes - extra.memory_bytes
    if free < request.memory_bytes + headroom * gpu.memory_total_bytes:
        reasons.append(RankReason.MEMORY)
    sharers = gpu.running_tasks + extra.tasks + 1
    factor = slowdown_factor(sharers)
    slowdown = sharers * factor
    predicted = None
    if request.runtime_s is not None:
        predicted = request.runtime_s * slowdown
        if predicted > request.deadline_s:
            reasons.append(RankReason.PREDICTED_MISS)
    candidate = Candidate(
        node=node,
        gpu=gpu.gpu,
        model=gpu.model,
        reasons=tuple(reasons),
        memory_free_bytes=free,
        float_time_s=gpu.float_time_s,
        running_tasks=sharers - 1,
        busy_ratio=gpu.busy_ratio,
        slowdown=slowdown,
        predicted_s=predicted,
    )
    return (slowdown, round(gpu.busy_ratio, 2), -free, node, gpu.gpu), candidate
