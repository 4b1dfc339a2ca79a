"""The policy's inputs and its output: knobs, trigger, ledger, recent history; decision.

What ``decide`` gets (``PolicyConfig``, ``Trigger``, ``Ledger``, ``Recent``, besides the
exporter's state) and what it returns (a ``Decision``: steps and skips). Plain frozen
data, shared by the actuator's other parts (the executor, the journal, the history).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuguard.actuator.state import DeviceKey
from gpuguard.contract import SkipReason, StepReason, TriggerSource, Verb

PAUSE = Verb.PAUSE
UNPAUSE = Verb.UNPAUSE
ORDERS = ("fifo", "edf")
#: a container whose task ended this recently, with no next one seen yet, is between two
#: tasks (and one seen computing this soon after a drain went straight on: a repeater)
REPEAT_GAP_S = 2.0
#: a cgroup freeze's cost until one is measured (the freezer's ~1 ms)
FREEZE_S = 0.001


@dataclass(frozen=True)
class RateLaw:
    """The controller's knobs (``--besteffort.*``)."""

    period_s: float = 1.0
    #: least run fraction of a best-effort container beside active real-time work
    floor: float = 0.1
    #: on busy/idle edges the floor is held over this window, not each period: a container
    #: that ran its share of the last window is not thawed into busy real-time work
    floor_window_s: float = 10.0  # ten periods
    #: run fraction without any real-time signal (open loop), and where control starts
    initial: float = 0.1
    #: run-fraction change per unit of normalised error, backing off ...
    gain: float = 0.2
    #: ... and probing upwards (smaller: a miss costs more than a lost step)
    gain_up: float = 0.05
    #: errors within this are noise
    deadband: float = 0.1
    max_step: float = 0.2
    stale_after_s: float = 15.0
    #: a change shows in the signal this long after it (the rule's window, scrape, evaluation)
    settle_s: float = 12.0
    #: without an SLO: the real-time side's mean slowdown the best-effort side may cause,
    #: from its measured demand (``interference_fraction``); 0: open loop at ``initial``
    max_slowdown: float = 1.05

    def __post_init__(self) -> None:
        if not 0 <= self.floor <= self.initial <= 1:
            raise ValueError("need 0 <= floor <= initial <= 1")
        if self.period_s <= 0 or self.stale_after_s <= 0:
            raise ValueError("period and staleness must be positive")
        if self.floor_window_s < self.period_s:
            raise ValueError("the floor's window must be at least a period")
        if self.settle_s < 0:
            raise ValueError("settling time must not be negative")
        if min(self.gain, self.gain_up, self.deadband, self.max_step) < 0:
            raise ValueError("gains, dead band and step must not be negative")
        if self.max_slowdown != 0 and self.max_slowdown <= 1:
            raise ValueError("the slowdown bound must be above 1 (or 0: none)")


@dataclass(frozen=True)
class DutyCycle:
    """A device's duty cycle: periods start at ``phase`` (wall time), each running first."""

    run_fraction: float
    period_s: float
    phase: float

    def frozen_at(self, now: float) -> bool:
        """Whether best-effort work on the device is to be frozen at ``now``."""
        if self.run_fraction >= 1:
            return False
        into = (now - self.phase) % self.period_s
        return into >= self.run_fraction * self.period_s

    def next_switch(self, now: float) -> float:
        """The next moment ``frozen_at`` changes (for the controller's timer)."""
        start = now - (now - self.phase) % self.period_s
        run_end = start + self.run_fraction * self.period_s
        return run_end if now < run_end else start + self.period_s


@dataclass(frozen=True)
class PolicyConfig:
    """The policy's knobs (``--policy.*``)."""

    order: str = "fifo"
    max_actions: int = 10
    input_timeout_s: float = 5.0
    memory_threshold: float = 0.95
    #: utilization_ratio at or above which the GPU counts as saturated.
    saturation_ratio: float = 0.99
    #: a snapshot older than this (or with a failed source) is not acted on.
    stale_after_s: float = 5.0
    #: paper B's one task per device at a time, whatever the demands (headroom off)
    one_at_a_time: bool = False
    #: freeze a computing task that holds a device a task with precedence waits for
    preempt: bool = True
    #: a task admitted this recently is not preempted
    preempt_quantum_s: float = 0.5
    #: a container that yielded between tasks waits at most this long for its turn
    max_yield_s: float = 30.0
    #: a real-time container's freeze ends this long (and its longest recent run) before its slack
    #: does: before its deadline from its task's start (a ranked task), or from the
    #: freeze's start (a server: a request may have come as it began)
    slack_margin_s: float = 0.5
    #: the rate controller's law and duty cycle (real-time work seen through NVML only)
    rate: RateLaw = field(default_factory=RateLaw)


@dataclass(frozen=True)
class Trigger:
    """Why a decision runs; ``gpu``/``node`` narrow it (an alert's labels)."""

    source: TriggerSource
    now: float
    node: str | None = None
    gpu: int | None = None
    alert: str | None = None


@dataclass(frozen=True)
class Ledger:
    """What this actuator itself did, from its journal: the only containers it may unpause.

    ``paused``: container id -> wall time this actuator paused it.
    ``admitted``: container id -> wall time this actuator last unpaused it to run (an
    admission, or a best-effort container's share); the container admitted last on a device
    is the one with the newest time there.
    ``exempt_tasks``: tasks released after ``--max-pause``; never paused again.
    """

    paused: Mapping[str, float] = field(default_factory=dict)
    admitted: Mapping[str, float] = field(default_factory=dict)
    exempt_tasks: frozenset[str] = frozenset()
    #: containers paused as they drained or between tasks (``yield``) -> the GPU: queued
    #: as their next task would be
    yielded: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Recent:
    """What the actuator saw lately (memory only; the controller keeps it, see
    ``gpuguard/actuator/admission/history.py``). Empty after a restart, which only starts
    cycles afresh.

    ``serving``: containers seen beginning a new task already computing within
    ``REPEAT_GAP_S`` of the last one's drain, more than once: their memory stays cached
    between requests (``precedence.servers``).
    ``realtime_seen``: device -> last time a real-time task ran or waited on it.
    ``straight_on``: containers seen (or whose image was last seen) computing again within
    ``REPEAT_GAP_S`` of a drain with no input phase between: they yield as they drain.
    ``duty_cycles``, ``run_fractions``: the rate controller's state.
    ``freeze_s``: the executor's measured freeze (a moving average of its recent ones).
    ``steps``: container -> the longest of its last steps seen whole while it ran unfrozen
    (``Activity.last_step``): the work it has in flight when frozen.
    ``runs``: container -> when it ran unfrozen by us lately (oldest first, each span
    ``(thawed, frozen)``; time before the actuator first saw it is not among them).
    ``started_idle``: containers whose process sat on the GPU, unpaused, for a second
    before any kernel of theirs (a server's start-up: its model loaded, then a wait for
    requests).
    """

    #: containers seen serving: a new task computing at once after a drain (twice)
    serving: frozenset[str] = frozenset()
    realtime_seen: Mapping[DeviceKey, float] = field(default_factory=dict)
    #: containers seen (or whose image was last seen) going straight on after a drain
    straight_on: frozenset[str] = frozenset()
    #: rate control: the duty cycles running, by device (``admission/history.py``) ...
    duty_cycles: Mapping[DeviceKey, DutyCycle] = field(default_factory=dict)
    #: ... and the run fraction the controller set for every device it has stepped
    run_fractions: Mapping[DeviceKey, float] = field(default_factory=dict)
    #: a freeze's cost as measured lately (asked -> every process frozen), in seconds
    freeze_s: float = FREEZE_S
    #: container -> its steps' length, learnt while it ran unfrozen
    steps: Mapping[str, float] = field(default_factory=dict)
    #: container -> its spans run unfrozen lately, up to its current freeze (the floor's
    #: window on edges)
    runs: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    #: containers that sat on the GPU, unpaused, for a second before any kernel
    started_idle: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Step:
    """One container the policy (or the safety net) pauses or unpauses, and why."""

    verb: Verb  # PAUSE or UNPAUSE
    container_id: str
    container: str
    reason: StepReason
    gpu: int | None = None
    task_id: str | None = None


@dataclass(frozen=True)
class Skip:
    """A step held back, and why."""

    reason: SkipReason
    detail: str
    container_id: str | None = None
    task_id: str | None = None
    gpu: int | None = None


@dataclass(frozen=True)
class Decision:
    """What one decision does (``steps``) and holds back (``skips``)."""

    steps: tuple[Step, ...] = ()
    skips: tuple[Skip, ...] = ()
    #: devices where a real-time task runs or waits now (``Recent.realtime_seen``)
    realtime_devices: frozenset[DeviceKey] = frozenset()
    #: wall time at which a hold, share or quantum falls due: decide again then
    next_due: float | None = None
    #: rate control: the duty cycle of every device where one runs now (its best-effort
    #: work beside active real-time work); None: not planned (stale state)
    duty_cycles: Mapping[DeviceKey, DutyCycle] | None = None
