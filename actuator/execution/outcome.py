"""What became of one pause or unpause (``Outcome``), built the same way on every path."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TypeVar

from gpuguard.actuator.decision import Step
from gpuguard.actuator.engine.base import Answer, Attempt
from gpuguard.contract import Result, SkipReason, Verb

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome:
    """What became of one action."""

    action: Verb
    result: Result
    container_id: str
    skip_reason: SkipReason | None = None
    detail: str = ""
    started: float = 0.0
    finished: float = 0.0
    engine_down: bool = False
    #: a pause: ``cgroup`` or ``runtime_pause``; the wall time every process was frozen
    #: (the kernel said so, or the runtime's pause returned) and the freeze's own milliseconds
    method: str | None = None
    frozen_at: float | None = None
    freeze_ms: float | None = None


def done(
    action: Step,
    started: float,
    result: Result,
    skip_reason: SkipReason | None = None,
    detail: str = "",
    engine_down: bool = False,
) -> Outcome:
    """The outcome of ``action``, finished now."""
    return Outcome(
        action=action.verb,
        result=result,
        container_id=action.container_id,
        skip_reason=skip_reason,
        detail=detail,
        started=started,
        finished=time.time(),
        engine_down=engine_down,
    )


def not_done(action: Step, started: float, tried: Attempt[T]) -> Outcome:
    """An engine call that did not go through: a container gone is a skip; an engine down a
    failure worth a retry (the journal entry is kept); a refusal a failure."""
    if tried.answer is Answer.GONE:
        return done(action, started, Result.SKIPPED, SkipReason.VANISHED, "container is gone")
    down = tried.answer is Answer.DOWN
    return done(action, started, Result.FAILED, None, tried.detail, engine_down=down)


def with_freeze(
    outcome: Outcome, method: str, frozen_at: float | None, freeze_ms: float | None
) -> Outcome:
    """The pause's outcome with how it was taken (``method``) and when it took effect."""
    return dataclasses.replace(outcome, method=method, frozen_at=frozen_at, freeze_ms=freeze_ms)
