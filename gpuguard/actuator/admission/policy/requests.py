"""Servers' requests running now, as their exact activity shows them: when each falls due,
and how much longer it may run. Pure.

A server seen by the launch probe is busy from the first call of a request, on its edge,
before the exporter's next poll shows the busy period as a task: another server waits for
it from there (``precedence.plan_servers``). An in-flight gauge is read on a poll, so the
start it shows may be late: a server seen through one shares, as one seen through NVML. Why:
docs/design-notes.md, "Two servers seen exactly: the sooner request first".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gpuguard.actuator.admission.policy.order import CLASS_RANK
from gpuguard.actuator.admission.policy.views import own_deadline
from gpuguard.actuator.state import Container, DeviceKey, ExporterState
from gpuguard.contract import ActivitySource, PriorityClass


@dataclass(frozen=True)
class Request:
    """A server's busy period running now: the first request it may hold began at
    ``started_at`` (every request in it came after), so none falls due before ``due``."""

    cid: str
    klass: PriorityClass
    started_at: float
    deadline_s: float
    #: its longest run learnt (one request's, or a busy period's); None: none learnt yet
    longest_s: float | None

    @property
    def due(self) -> float:
        return self.started_at + self.deadline_s

    def left_s(self, now: float) -> float | None:
        """How much longer it may run: its longest run less what it has run; its whole
        longest run once it has run longer (a busy period that merged requests: the one
        running now may have just begun). None: no run learnt."""
        if self.longest_s is None:
            return None
        ran = now - self.started_at
        return self.longest_s - ran if ran < self.longest_s else self.longest_s


def timed_by_launches(container: Container | None) -> bool:
    """Whether the launch probe times its busy periods (their starts are its first calls)."""
    activity = container.activity if container is not None else None
    return activity is not None and activity.source == ActivitySource.LAUNCH


def running_requests(
    state: ExporterState,
    devices: Mapping[str, Collection[DeviceKey]],
    servers: Collection[str],
    paused: Collection[str],
) -> dict[DeviceKey, tuple[Request, ...]]:
    """Device -> the busy periods of ``servers`` the launch probe times there: real-time,
    with a deadline, busy, and paused neither by Docker nor by this actuator (``paused``).
    ``devices``: ``devices_of(state)``."""
    found: dict[DeviceKey, list[Request]] = {}
    for c in state.containers:
        activity = c.activity if timed_by_launches(c) else None
        deadline = own_deadline(c.priority_class, c)
        if (
            c.id not in servers
            or activity is None
            or not activity.busy
            or activity.busy_since is None
            or deadline is None
            or c.paused
            or c.id in paused
        ):
            continue
        request = Request(c.id, c.priority_class, activity.busy_since, deadline, c.longest_run_s)
        for device in devices.get(c.id, ()):
            found.setdefault(device, []).append(request)
    return {device: tuple(requests) for device, requests in found.items()}


def sooner(
    requests: Sequence[Request], cid: str, klass: PriorityClass, due: float
) -> list[Request]:
    """The requests of other containers, of ``klass`` or higher, that fall due before
    ``due``."""
    return [
        r
        for r in requests
        if r.cid != cid and CLASS_RANK[r.klass] <= CLASS_RANK[klass] and r.due < due
    ]


def covers(at: float, requests: Sequence[Request], now: float) -> bool:
    """Whether a wait until ``at`` outlasts ``requests``: a thaw for its slack while one of
    them runs only moves the waiter's work later into the same requests."""
    left = [r.left_s(now) for r in requests]
    return all(x is not None and now + x <= at for x in left)


def began_since(requests: Sequence[Request], at: float | None) -> bool:
    """Whether one of ``requests`` began after ``at`` (a thaw): a wait for it is new."""
    return at is None or any(r.started_at > at for r in requests)
