"""The policy's inputs and its output: knobs, trigger, ledger, recent history; decision.

What ``decide`` gets (``PolicyConfig``, ``Trigger``, ``Ledger``, ``Recent``, besides the
exporter's state) and what it returns (a ``Decision``: steps and skips). Plain frozen
data, shared by the actuator's other parts (the executor, the journal, the history).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuguard.actuator.admission.ratecontrol import DutyCycle, RateLaw
from gpuguard.actuator.state import DeviceKey
from gpuguard.contract import SkipReason, StepReason, TriggerSource, Verb

PAUSE = Verb.PAUSE
UNPAUSE = Verb.UNPAUSE
ORDERS = ("fifo", "edf")
#: how best-effort work beside real-time work is held back: ``hold`` (frozen while real-time
#: work is seen, held past it, a starvation share) or ``rate`` (a duty cycle set by feedback)
BEST_EFFORT_CONTROLS = ("hold", "rate")
#: a container whose task ended this recently, with no next one seen yet, is between two
#: tasks (and one seen computing this soon after a drain went straight on: a repeater)
REPEAT_GAP_S = 2.0


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
    #: share of each window a frozen best-effort container runs anyway (0: never).
    best_effort_min_share: float = 0.1
    best_effort_window_s: float = 10.0
    #: that share on a device under SLO pressure (a real-time SLO alert fires there)
    slo_best_effort_min_share: float = 0.02
    #: paper B's one task per device at a time, whatever the demands (headroom off)
    one_at_a_time: bool = False
    #: freeze a computing task that holds a device a task with precedence waits for
    preempt: bool = True
    #: a task admitted this recently is not preempted
    preempt_quantum_s: float = 0.5
    #: a best-effort freeze outlasts the last real-time activity on its devices by this much
    #: (two NVML sample periods: a draining report the next sample contradicts thaws nothing)
    best_effort_hold_s: float = 0.3
    #: the hold doubles while freezes follow thaws closely, up to this
    best_effort_hold_max_s: float = 4.0
    #: a container that yielded between tasks waits at most this long for its turn
    max_yield_s: float = 30.0
    #: best-effort work is not frozen for a real-time container whose requests NVML cannot
    #: separate (its busy periods merge them) and whose demand is at most this share
    best_effort_coexist_demand: float = 0.5
    #: a real-time container's freeze ends this long (and its longest recent run) before its slack
    #: does: before its deadline from its task's start (a ranked task), or from the
    #: freeze's start (a server: a request may have come as it began)
    slack_margin_s: float = 0.5
    #: ``rate`` or ``hold`` (``BEST_EFFORT_CONTROLS``; ``policy/besteffort.py``)
    best_effort_control: str = "rate"
    #: the rate controller's law and duty cycle (``best_effort_control == "rate"``)
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
    ``actuator/admission/history.py``). Empty after a restart, which only makes holds start afresh.

    ``serving``: containers seen beginning a new task already computing within
    ``REPEAT_GAP_S`` of the last one's drain, more than once: their memory stays cached
    between requests (``precedence.servers``).
    ``realtime_seen``: device -> last time a real-time task ran or waited on it.
    ``frozen_spans``: best-effort container -> its finished freezes (start, end) that reach
    into the last window; the current freeze is ``Ledger.paused``.
    ``hold_s``: best-effort container -> its current (adaptive) hold.
    ``straight_on``: containers seen (or whose image was last seen) computing again within
    ``REPEAT_GAP_S`` of a drain with no input phase between: they yield as they drain.
    ``duty_cycles``, ``run_fractions``: the rate controller's state (``rate`` control only).
    """

    #: containers seen serving: a new task computing at once after a drain (twice)
    serving: frozenset[str] = frozenset()
    realtime_seen: Mapping[DeviceKey, float] = field(default_factory=dict)
    frozen_spans: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    hold_s: Mapping[str, float] = field(default_factory=dict)
    #: containers seen (or whose image was last seen) going straight on after a drain
    straight_on: frozenset[str] = frozenset()
    #: rate control: the duty cycles running, by device (``admission/history.py``) ...
    duty_cycles: Mapping[DeviceKey, DutyCycle] = field(default_factory=dict)
    #: ... and the run fraction the controller set for every device it has stepped
    run_fractions: Mapping[DeviceKey, float] = field(default_factory=dict)


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
    #: work beside active real-time work); None: not planned (hold control, stale state)
    duty_cycles: Mapping[DeviceKey, DutyCycle] | None = None
