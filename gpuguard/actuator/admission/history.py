"""What the actuator saw lately, for the policy's holds and sliding windows (memory only).

The policy is pure: it gets this as ``policy.Recent`` and says what it saw in the
``Decision`` (``realtime_devices``, ``duty_cycles``); the controller feeds both back here
under its lock, with what the executor really did. Under rate control (``RateHistory``) the
run fraction of each device and its duty cycle live here too, and the controller's step
(``ratecontrol.control_step``) runs here once per period. Nothing here survives a restart,
which only makes a hold start afresh and a run fraction start again at
``--besteffort.initial``; the journal keeps the freeze in progress (``Ledger.paused``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuguard.actuator.admission.ratecontrol import (
    Change,
    RateStep,
    SloReading,
    control_step,
    interference_step,
)
from gpuguard.actuator.decision import (
    FREEZE_S,
    PAUSE,
    REPEAT_GAP_S,
    UNPAUSE,
    Decision,
    DutyCycle,
    PolicyConfig,
    RateLaw,
    Recent,
    Step,
)
from gpuguard.actuator.state import DeviceKey, ExporterState
from gpuguard.contract import PRE_KERNEL, Phase, PriorityClass, Result

_DONE = (Result.OK, Result.ALREADY)
#: what a container or image was seen to do is remembered this long
REPEATER_MEMORY_S = 600.0
#: a container seen this many times beginning a new task already computing right after a
#: drain serves requests (once could be a short input phase no decision happened to see)
SERVES = 2
#: each measured freeze moves ``Recent.freeze_s`` this far towards it
FREEZE_WEIGHT = 0.2
#: a container whose process sat on the GPU this long, unpaused, before its first kernel
#: loaded and waits for work: a long-lived program, not a one-shot (``Recent.started_idle``)
STARTED_IDLE_S = 1.0
#: a best-effort container's steps seen whole while it ran unfrozen, kept for
#: ``Recent.steps`` (the longest of them)
STEP_SAMPLES = 8
#: a best-effort container's spans run unfrozen, kept for ``Recent.runs`` (those within
#: the floor's window go out)
RUN_SPANS = 256


@dataclass(frozen=True)
class ControlStep:
    """One control step of a device's run fraction (metrics, audit)."""

    device: DeviceKey
    step: RateStep
    run_fraction: float
    changed: bool
    #: what set it: ``slo`` (a declared SLO), ``interference`` (the best-effort demand) or
    #: ``none`` (open loop)
    signal: str = "none"


class RateHistory:
    """The rate controller's state, by device: the run fraction it set, its last change,
    the phase of the duty cycle running there (while real-time work is active), the time of
    its last step. Not thread-safe: the controller calls it under its lock."""

    def __init__(self, law: RateLaw) -> None:
        self.law = law
        self._fraction: dict[DeviceKey, float] = {}
        self._change: dict[DeviceKey, Change] = {}
        self._phase: dict[DeviceKey, float] = {}
        self._stepped_at: dict[DeviceKey, float] = {}
        #: when each running cycle's control began (a first reading takes a while)
        self._since: dict[DeviceKey, float] = {}

    def control(
        self,
        readings: Mapping[DeviceKey, Sequence[SloReading]],
        declared: frozenset[DeviceKey],
        now: float,
        demand: Mapping[DeviceKey, float | None] | None = None,
    ) -> list[ControlStep]:
        """A control step for each device whose duty cycle runs, once per period.

        ``declared``: devices where a real-time container declares an SLO, controlled on
        ``readings`` (the SLO readings of each device's real-time containers); the others
        on ``demand`` (``ratecontrol.besteffort_demand``: the interference law), open loop
        where it is unknown.
        """
        done = []
        for device in sorted(self._phase):
            if now - self._stepped_at.get(device, -math.inf) < self.law.period_s:
                continue
            current = self._fraction.get(device, self.law.initial)
            last = self._change.setdefault(device, Change(now))
            since = self._since.setdefault(device, now)
            if device in declared:
                signal = "slo"
                fraction, step = control_step(
                    current, readings.get(device, ()), True, last, now, self.law, since
                )
            else:
                fraction, step = interference_step(current, (demand or {}).get(device), self.law)
                signal = "none" if step is RateStep.OPEN_LOOP else "interference"
            self._stepped_at[device] = now
            self._fraction[device] = fraction
            changed = fraction != current
            if changed:
                self._change[device] = Change(now, step)
            done.append(ControlStep(device, step, fraction, changed, signal))
        return done

    def cycles(self) -> dict[DeviceKey, DutyCycle]:
        """The duty cycles running, at the fractions set now."""
        return {
            device: DutyCycle(
                self._fraction.get(device, self.law.initial), self.law.period_s, phase
            )
            for device, phase in self._phase.items()
        }

    def fractions(self) -> dict[DeviceKey, float]:
        return dict(self._fraction)

    def ran(self, cycles: Mapping[DeviceKey, DutyCycle] | None) -> None:
        """Keep the phases of the cycles a decision ran; a device it ran none on is idle
        (its next cycle starts afresh, frozen first)."""
        if cycles is None:
            return  # not planned: nothing changes
        self._phase = {device: cycle.phase for device, cycle in cycles.items()}
        self._since = {d: t for d, t in self._since.items() if d in self._phase}
        for device, cycle in cycles.items():
            self._fraction.setdefault(device, cycle.run_fraction)


class RecentHistory:
    """Feeds ``Recent``: real-time activity per device, how programs go on, measured freezes.

    Not thread-safe: the controller calls it under its lock.
    """

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self._realtime_seen: dict[DeviceKey, float] = {}
        self._drained_at: dict[str, float] = {}
        self._drained_task: dict[str, str] = {}  # the task that drained then
        #: container -> (last time, times) it began a new task already computing right
        #: after its last one drained (``Recent.serving``)
        self._serving: dict[str, tuple[float, int]] = {}
        #: container id or "image:<name>" -> (when, goes straight on)
        self._learnt: dict[str, tuple[float, bool]] = {}
        self._tasks_seen: dict[str, set[str]] = {}  # up to two task ids per container
        self._image_of: dict[str, str] = {}
        self._straight_on: frozenset[str] = frozenset()
        #: rate control's state
        self.rates = RateHistory(config.rate)
        self._freeze_s = FREEZE_S
        #: best-effort containers: when our freeze of each frozen one was done, when each
        #: was last thawed, and its last steps seen whole while it ran (``Recent.steps``)
        self._frozen_at: dict[str, float] = {}
        self._thawed_at: dict[str, float] = {}
        self._steps: dict[str, deque[float]] = {}
        self._step_end: dict[str, float] = {}
        #: best-effort containers: when first seen, and the spans each ran unfrozen since
        #: (``Recent.runs``: the floor's window on edges)
        self._first_seen: dict[str, float] = {}
        self._runs: dict[str, deque[tuple[float, float]]] = {}
        #: containers on the GPU, unpaused, with no kernel seen yet: since when
        #: (``Recent.started_idle``)
        self._idle_on_gpu: dict[str, float] = {}
        self._started_idle: set[str] = set()
        self._had_kernel: set[str] = set()

    def saw(self, state: ExporterState, now: float) -> None:
        """Learn from a snapshot how each program goes on after a task.

        It goes *straight on* when, within ``REPEAT_GAP_S`` of a drain, it is seen computing
        again with no input phase in between (its memory stays cached, its next kernel is
        launched at once: the same task going on, or the next one first seen computing; the
        latter, seen twice, is a program that *serves*, ``Recent.serving``). It
        does not when its next task shows its input first (a newcomer pause catches that
        in time), or when it left after a single task (paper B's one-shot). What a program
        does is learnt for its image too: a new container of an image is taken to behave as
        the last one that showed it, until it shows otherwise itself (a tenant's image only
        ever speaks for the tenant's own containers).
        """
        self._learn_steps(state)
        self._learn_start(state, now)
        for c in state.containers:
            if c.priority_class == PriorityClass.BEST_EFFORT:
                self._first_seen.setdefault(c.id, now)
        images = {c.id: f"image:{c.image}" for c in state.containers if c.image}
        running = {c.id for c in state.containers if c.state in ("running", "paused")}
        for task in state.tasks:
            cid = task.container_id
            if cid is None:
                continue
            seen = self._tasks_seen.setdefault(cid, set())
            if len(seen) < 2:
                seen.add(task.task_id)
            if cid in images:
                self._image_of[cid] = images[cid]
            if task.paused:
                continue
            if task.phase == Phase.DRAINING:
                self._drained_at.setdefault(cid, now)
                self._drained_task.setdefault(cid, task.task_id)
            elif task.phase == Phase.COMPUTING or task.phase in PRE_KERNEL:
                drained = self._drained_at.pop(cid, None)
                drained_task = self._drained_task.pop(cid, None)
                if drained is not None and now - drained <= REPEAT_GAP_S:
                    self._learn(cid, task.phase == Phase.COMPUTING, now)
                    if task.phase == Phase.COMPUTING and drained_task != task.task_id:
                        _, times = self._serving.get(cid, (now, 0))
                        self._serving[cid] = (now, times + 1)
        for cid in [c for c in self._tasks_seen if c not in running]:
            if len(self._tasks_seen.pop(cid)) == 1:
                self._learn(cid, False, now, left=True)  # left after one task
            self._drained_at.pop(cid, None)
            self._drained_task.pop(cid, None)
            self._serving.pop(cid, None)
            self._image_of.pop(cid, None)
        for cid in [c for c, t in self._drained_at.items() if now - t > REPEAT_GAP_S]:
            del self._drained_at[cid]
            self._drained_task.pop(cid, None)
        for cid in [c for c, (t, _) in self._serving.items() if now - t > REPEATER_MEMORY_S]:
            del self._serving[cid]
        for key in [k for k, (t, _) in self._learnt.items() if now - t > REPEATER_MEMORY_S]:
            del self._learnt[key]
        self._straight_on = frozenset(
            c.id for c in state.containers if self._goes_straight_on(c.id, c.image)
        )

    def _learn_start(self, state: ExporterState, now: float) -> None:
        """A container whose process sat on the GPU, unpaused, for ``STARTED_IDLE_S`` before
        any of its tasks launched a kernel (a server that loaded its model, as an input
        phase or none, and waits for a request) *started idle*, from that read on; one whose
        first kernel came sooner (a one-shot: context, input, kernels; a repeater; a
        trainer) did not. Time paused does not count: a one-shot waits in its input phase
        only where admission paused it. Learnt once per container."""
        on_gpu = {c.id for c in state.containers if c.devices}
        kernel: set[str] = set()
        paused: set[str] = set()
        for task in state.tasks:
            if task.container_id is None:
                continue
            on_gpu.add(task.container_id)
            if task.phase not in PRE_KERNEL:
                kernel.add(task.container_id)
            if task.paused:
                paused.add(task.container_id)
        for c in state.containers:
            if c.id in self._had_kernel or c.id in self._started_idle:
                continue
            if c.id in kernel:
                self._had_kernel.add(c.id)
                self._idle_on_gpu.pop(c.id, None)
            elif c.id not in on_gpu or c.paused or c.id in paused:
                self._idle_on_gpu.pop(c.id, None)
            elif now - self._idle_on_gpu.setdefault(c.id, now) >= STARTED_IDLE_S:
                self._started_idle.add(c.id)
                del self._idle_on_gpu[c.id]

    def _learn_steps(self, state: ExporterState) -> None:
        """A best-effort container's newest step seen whole counts if it ran unfrozen: it
        began after our last thaw and ended before our freeze, if one holds it (a step a
        freeze fell into lasts as long as the freeze)."""
        for c in state.containers:
            step = c.activity.last_step if c.activity is not None else None
            if c.priority_class != PriorityClass.BEST_EFFORT or step is None:
                continue
            start, end = step
            if self._step_end.get(c.id) == end:
                continue  # seen at an earlier read
            self._step_end[c.id] = end
            frozen = self._frozen_at.get(c.id)
            if start >= self._thawed_at.get(c.id, -math.inf) and (frozen is None or end <= frozen):
                self._steps.setdefault(c.id, deque(maxlen=STEP_SAMPLES)).append(end - start)

    def _learn(self, cid: str, straight_on: bool, now: float, left: bool = False) -> None:
        """Going straight on, once seen, sticks to a container (a program that re-allocates
        across a poll now and then still launches at once the rest of the time). Its image
        takes what the container showed, except that one next input seen in time does not
        undo it: only leaving after a single task (``left``) says the image is a one-shot's.
        """
        own = self._learnt.get(cid)
        if straight_on or own is None or not own[1]:
            self._learnt[cid] = (now, straight_on or (own is not None and own[1]))
        image = self._image_of.get(cid)
        if image is not None and (straight_on or left):
            self._learnt[image] = (now, straight_on)

    def _goes_straight_on(self, cid: str, image: str) -> bool:
        learnt = self._learnt.get(cid) or (self._learnt.get(f"image:{image}") if image else None)
        return learnt is not None and learnt[1]

    def snapshot(self, now: float) -> Recent:
        """The policy's view."""
        return Recent(
            serving=frozenset(c for c, (_, times) in self._serving.items() if times >= SERVES),
            realtime_seen=dict(self._realtime_seen),
            straight_on=self._straight_on,
            duty_cycles=self.rates.cycles(),
            run_fractions=self.rates.fractions(),
            freeze_s=self._freeze_s,
            steps={cid: max(steps) for cid, steps in self._steps.items()},
            started_idle=frozenset(self._started_idle),
            runs={cid: self._runs_since(cid, now - self.config.rate.floor_window_s)
                  for cid in self._runs},
        )  # fmt: skip

    def _runs_since(self, cid: str, since: float) -> tuple[tuple[float, float], ...]:
        runs = self._runs[cid]
        while runs and runs[0][1] <= since:
            runs.popleft()
        return tuple(runs)

    def observe(
        self,
        decision: Decision,
        done: Sequence[tuple[Step, Result]],
        now: float,
        freezes_s: Sequence[float | None] = (),
    ) -> None:
        """Record a decision, what became of its steps and how long its freezes took."""
        for took in freezes_s:
            if took is not None:
                self._freeze_s += FREEZE_WEIGHT * (took - self._freeze_s)
        for step, result in done:
            if result not in _DONE:
                continue
            if step.verb == PAUSE:
                if step.container_id not in self._frozen_at:
                    self._ran_until(step.container_id, now)
                self._frozen_at.setdefault(step.container_id, now)
            elif step.verb == UNPAUSE:
                self._frozen_at.pop(step.container_id, None)
                self._thawed_at[step.container_id] = now
        for device in decision.realtime_devices:
            self._realtime_seen[device] = now
        self.rates.ran(decision.duty_cycles)

    def _ran_until(self, cid: str, frozen: float) -> None:
        """A best-effort container ran from its last thaw (or its first sighting) until
        our freeze at ``frozen``."""
        if cid not in self._first_seen:
            return  # not best-effort: no floor
        start = self._thawed_at.get(cid, self._first_seen[cid])
        if frozen > start:
            self._runs.setdefault(cid, deque(maxlen=RUN_SPANS)).append((start, frozen))

    def forget(self, alive: set[str]) -> None:
        """Drop containers that are gone."""
        self._started_idle &= alive
        self._had_kernel &= alive
        for table in (
            self._drained_at,
            self._drained_task,
            self._serving,
            self._frozen_at,
            self._thawed_at,
            self._steps,
            self._step_end,
            self._first_seen,
            self._runs,
            self._idle_on_gpu,
        ):
            for cid in [c for c in table if c not in alive]:
                del table[cid]
