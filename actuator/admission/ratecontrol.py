"""Best-effort under rate control: how much of the time a best-effort container may run beside
real-time work on its device, set by feedback (an integral law on the tenant's SLO
attainment, else the interference law on measured demand). Pure.

Why rate control, and why these laws: docs/design-notes.md, "Rate control's laws".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpuguard.actuator.decision import RateLaw
from gpuguard.actuator.state import DeviceKey, ExporterState
from gpuguard.contract import PriorityClass
from gpuguard.slowdown import slowdown_factor

#: the speed a kernel loses while one other kernel time-slices the device with it
CONTENTION = 1 - 1 / (2 * slowdown_factor(2))
#: the interference law leaves a run fraction within this of its target as it is (a
#: measured demand moves by a few hundredths from sample to sample)
FRACTION_DEADBAND = 0.02


class RateStep(StrEnum):
    """What one control step did, and why (audit and metrics)."""

    UP = "up"  # the real-time side has room: best-effort runs more
    DOWN = "down"  # it suffers past its objective: best-effort runs less
    HOLD = "hold"  # within the dead band
    STALE = "stale"  # no fresh signal: towards the floor
    #: no SLO is declared and the best-effort demand is unknown: the configured fraction
    OPEN_LOOP = "open_loop"
    #: the signal does not yet show what the last change did (``RateLaw.settle_s``)
    SETTLING = "settling"


@dataclass(frozen=True)
class SloReading:
    """One real-time container's SLO attainment on a device, as measured."""

    attainment: float  # share of requests within the target, over the rule's window
    objective: float  # the tenant's declared objective, e.g. 0.99
    measured_at: float  # wall time of the evaluation

    def error(self) -> float:
        """Normalised to the error budget: 0 on target, -1 all in time, clipped at +5."""
        budget = max(1 - self.objective, 1e-3)
        return max(-1.0, min(5.0, (self.objective - self.attainment) / budget))


def worst_error(readings: Iterable[SloReading], now: float, law: RateLaw) -> float | None:
    """The governing error of a device's fresh readings, or None where none is fresh."""
    fresh = [
        r.error()
        for r in readings
        if now - r.measured_at <= law.stale_after_s and math.isfinite(r.attainment)
    ]
    return max(fresh) if fresh else None


def next_run_fraction(
    current: float, error: float | None, declared: bool, law: RateLaw
) -> tuple[float, RateStep]:
    """One control step: the next run fraction from the current one and the device's error.

    ``declared``: some real-time container on the device declares an SLO; without one there
    is nothing to control on, and the fraction is the configured one (open loop).
    """
    if not declared:
        return law.initial, RateStep.OPEN_LOOP
    if error is None:
        return max(law.floor, current - law.max_step), RateStep.STALE
    if abs(error) <= law.deadband:
        return _clamp(current, law), RateStep.HOLD
    gain = law.gain if error > 0 else law.gain_up
    step = max(-law.max_step, min(law.max_step, -gain * error))
    return _clamp(current + step, law), RateStep.DOWN if step < 0 else RateStep.UP


@dataclass(frozen=True)
class Change:
    """A device's last change of run fraction: when, and which way (None: none yet)."""

    at: float
    step: RateStep | None = None


def control_step(
    current: float,
    readings: Sequence[SloReading],
    declared: bool,
    last: Change,
    now: float,
    law: RateLaw,
    since: float | None = None,
) -> tuple[float, RateStep]:
    """One control step of a device: ``next_run_fraction`` on the readings that show what
    the last change did (``settle_s`` after it; after a step up, any later miss).

    ``since``: when control of the device began (its duty cycle started). Until
    ``stale_after_s`` after that, no reading is not yet a stale signal: a server's first
    window takes ``settle_s`` to appear, and its absence then says nothing.
    """
    if not declared:
        return next_run_fraction(current, None, declared, law)  # open loop
    if worst_error(readings, now, law) is None:
        if since is not None and now - since < law.stale_after_s:
            return _clamp(current, law), RateStep.SETTLING
        return next_run_fraction(current, None, True, law)  # stale
    settled = worst_error(
        [r for r in readings if r.measured_at >= last.at + law.settle_s], now, law
    )
    if settled is not None:
        return next_run_fraction(current, settled, True, law)
    if last.step is RateStep.UP:
        since_up = worst_error([r for r in readings if r.measured_at > last.at], now, law)
        if since_up is not None and since_up > law.deadband:
            return next_run_fraction(current, since_up, True, law)  # the probe hurt: back off
    return _clamp(current, law), RateStep.SETTLING


def interference_fraction(demand: float, law: RateLaw) -> float:
    """The largest run fraction at which best-effort work of this ``demand`` (the summed
    SM share of a device's best-effort containers while each computes alone) slows the
    real-time side by at most ``law.max_slowdown`` on average (module doc). Pure."""
    interference = min(1.0, max(0.0, demand)) * CONTENTION
    if interference <= 0:
        return 1.0
    return _clamp((1 - 1 / law.max_slowdown) / interference, law)


def besteffort_demand(state: ExporterState) -> dict[DeviceKey, float | None]:
    """Each device's best-effort demand: the summed SM share of the managed best-effort
    containers with a task there, each as it computes alone (``demand_sm_ratio``); None
    where one of them has not shown it yet. Pure."""
    demand: dict[DeviceKey, float | None] = {}
    seen: set[tuple[DeviceKey, str]] = set()
    for task in state.tasks:
        container = state.container(task.container_id)
        if container is None or container.priority_class != PriorityClass.BEST_EFFORT:
            continue
        if not container.managed or (task.device, container.id) in seen:
            continue
        seen.add((task.device, container.id))
        share, total = container.demand_sm_ratio, demand.get(task.device, 0.0)
        demand[task.device] = None if share is None or total is None else total + share
    return demand


def interference_step(current: float, demand: float | None, law: RateLaw) -> tuple[float, RateStep]:
    """One step of a device without a declared SLO: towards ``interference_fraction`` by at
    most ``max_step``; open loop at ``initial`` where the demand is unknown or the bound is
    off (``max_slowdown`` 0)."""
    if demand is None or not law.max_slowdown:
        return next_run_fraction(current, None, False, law)
    target = interference_fraction(demand, law)
    if abs(target - current) < FRACTION_DEADBAND:
        return _clamp(current, law), RateStep.HOLD  # the demand's own jitter: no change
    step = max(-law.max_step, min(law.max_step, target - current))
    return _clamp(current + step, law), RateStep.DOWN if step < 0 else RateStep.UP


def _clamp(fraction: float, law: RateLaw) -> float:
    return max(law.floor, min(1.0, fraction))
