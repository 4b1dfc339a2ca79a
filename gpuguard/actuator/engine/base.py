"""The container engine the actuator, reconcile and the guard act through: the few verbs
they use, in gpuguard's own types and errors.

An adapter per engine implements ``ContainerEngine`` (``docker.py``, ``containerd.py``) and
translates its library's errors, in that one place, into ``gpuguard/actuator/errors.py``'s:
``ContainerGone``, ``EngineConflict``, ``EngineRefused`` and ``EngineDown``. What those mean
for an action is read once, here, by ``attempt``: gone is a vanished container, down is an
engine that did not answer (retried a few times first), and a conflict means the container
changed meanwhile, so it is looked at again and the caller decides from how it stands now.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Generic, Protocol, TypeVar

from gpuguard.actuator.errors import (
    ContainerGone,
    EngineConflict,
    EngineDown,
    EngineError,
    EngineRefused,
)

T = TypeVar("T")

#: how often ``retried`` asks an engine that does not answer, and the pause between
RETRIES = 3
RETRY_DELAY_S = 0.05


@dataclass(frozen=True, slots=True)
class ContainerState:
    """One container as an engine reports it."""

    id: str
    name: str
    labels: Mapping[str, str]
    #: in Docker's words: ``created``, ``running``, ``paused``, ``restarting``, ``exited``...
    status: str
    running: bool  # its processes exist (a paused container's too)
    paused: bool
    #: the host PID of its init process; 0 when it is not running, or in a list where the
    #: engine does not say (Docker's)
    pid: int = 0


class ContainerEngine(Protocol):
    """What the actuator, reconcile and the guard ask of a container engine."""

    @property
    def name(self) -> str:
        """``docker`` or ``containerd``: the engine the audit names."""
        ...

    def ping(self) -> None:
        """Return when the engine answers; ``EngineDown`` when it does not."""
        ...

    def inspect(self, container_id: str) -> ContainerState:
        """The container as it is now; ``ContainerGone`` when there is none."""
        ...

    def containers(
        self, statuses: Collection[str] | None = None, label: str | None = None
    ) -> list[ContainerState]:
        """Every container (``statuses``: only in these states; ``label``: only those that
        carry it), a Kubernetes pod's sandbox never among them."""
        ...

    def pause(self, container_id: str) -> None:
        """The runtime's own pause; ``EngineConflict`` when it is not running."""
        ...

    def unpause(self, container_id: str) -> None:
        """The runtime's own unpause; ``EngineConflict`` when it is not paused."""
        ...


def retried(call: Callable[[], T], retries: int = RETRIES, delay_s: float = RETRY_DELAY_S) -> T:
    """Run an engine call, asking again while the engine does not answer; ``EngineDown``
    after ``retries`` tries, or at once when it hung (it took the request, never answered
    within its timeout: asking a hung engine again only multiplies the wait)."""
    last: EngineDown | None = None
    for tried in range(retries):
        try:
            return call()
        except EngineDown as exc:
            last = exc
            if exc.hung:
                break
            time.sleep(delay_s * (tried + 1))
    raise last if last is not None else EngineDown("engine not asked: no tries")


class Answer(Enum):
    """What became of one engine call about one container."""

    DONE = "done"
    GONE = "gone"  # the container no longer exists
    DOWN = "down"  # the engine did not answer, after retries: worth a retry later
    REFUSED = "refused"  # the engine said no; after a conflict ``Attempt.now`` says how it is


@dataclass(frozen=True)
class Attempt(Generic[T]):
    """One engine call's answer: its value when done, else the engine's error."""

    answer: Answer
    value: T | None = None
    error: EngineError | None = None
    #: after a conflict: the container looked at again (None: not looked at, or gone)
    now: ContainerState | None = None

    @property
    def detail(self) -> str:
        return "" if self.error is None else str(self.error)


def attempt(
    engine: ContainerEngine,
    call: Callable[[str], T],
    container_id: str,
    retries: int = RETRIES,
    delay_s: float = RETRY_DELAY_S,
    look_again: bool = True,
) -> Attempt[T]:
    """Run ``call(container_id)`` (``engine.pause``, say) and read the engine's errors, the
    one place they are read: the executor, reconcile and the guard each decide from the
    answer."""
    try:
        value = retried(functools.partial(call, container_id), retries, delay_s)
    except ContainerGone as exc:
        return Attempt(Answer.GONE, error=exc)
    except EngineDown as exc:
        return Attempt(Answer.DOWN, error=exc)
    except EngineRefused as exc:
        now = None
        if look_again and isinstance(exc, EngineConflict):
            try:
                now = retried(functools.partial(engine.inspect, container_id), retries, delay_s)
            except EngineError:
                now = None
        return Attempt(Answer.REFUSED, error=exc, now=now)
    return Attempt(Answer.DONE, value)
