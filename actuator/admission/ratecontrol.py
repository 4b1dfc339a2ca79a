"""Best-effort under rate control: how much of the time a best-effort container may run beside
real-time work on its device, set by feedback. Pure.

Why rate control and not detection: NVML samples a process about every 1/6 s, so a request
shorter than that is never seen on its own, and a server's requests merge into one busy
period. Freezing the best-effort container on seen activity then freezes it for as long as
the server lives (dense traffic) or thaws it in the middle of a request (sparse traffic with
a starvation guard). Instead, while real-time work is active on a device, each best-effort
container there runs a duty cycle through the cgroup freezer (about 1 ms a freeze): within
every ``period_s`` it runs for ``run_fraction`` of the period and is frozen for the rest,
every best-effort container of the device in the same phase, so the real-time side meets one
interferer at a time. The fraction is what feedback sets (TGS, NSDI '23, does the same for
opportunistic jobs, from inside the container):

* The signal is the real-time side's own: its latency SLO attainment where it declares one
  (the tenant's histogram, ``rules/``), as an error normalised to the objective's error
  budget: ``(objective - attainment) / (1 - objective)`` (0 on target, -1 with every request
  in time, +1 with twice the budget missed). Several real-time containers on a device: the
  worst one governs.
* The law is integral control with a dead band: ``run_fraction -= gain * error`` per control
  step, slewed to ``max_step`` and clamped to ``[floor, 1]``. Why this law: the plant
  (attainment as a function of the best-effort run fraction) is static and monotone, more
  running never helps the real-time side, so an integral controller with ``gain`` below the
  reciprocal of the plant's slope converges without overshoot (each correction is smaller
  than the error that caused it), and ends at the largest run fraction that keeps the
  objective: best-effort gets everything real-time can spare. The dead band keeps sampling
  noise from moving it (no chatter); backing off is faster than probing (``gain_up`` <
  ``gain``), since a miss costs a tenant and a lost step costs only throughput.
* The signal lags: attainment is a share over the rule's window (10 s), scraped and
  evaluated every second or so. An integral controller that stepped every period on a
  signal still describing the fraction of several steps ago would keep correcting an error
  it had already corrected, and overshoot (with a delay of ``D`` steps it stays monotone
  only for a loop gain under about ``1 / (e (D + 1))``, and the plant's slope is unknown,
  ten times steeper for a dense server than for a sparse one). So a step uses only readings
  taken ``settle_s`` (the window plus the scrape and evaluation) after the last change:
  each step sees what the previous one did, the condition the no-overshoot argument above
  needs whatever the plant's slope, as long as ``gain`` x slope < 1. Until then the step
  is ``settling``. One exception: a miss seen after a step *up* backs off at once, since
  the window before that step held none (the probe failed; waiting would only prolong it).
* A signal older than ``stale_after_s`` (Prometheus down, the tenant stopped exporting) is
  not believed: the fraction steps down to the floor, the side safe for real-time work.
  A device whose control began less than ``stale_after_s`` ago and has no reading yet is
  settling, not stale: a server's first window takes ``settle_s`` to appear.
* The floor is the starvation guard: a best-effort container runs at least ``floor`` of
  every period, whatever the signal says, so no freeze outlasts ``(1 - floor) x period``.

Without a declared SLO, the signal is the interference the exporter can measure
(``interference_fraction``). What it cannot measure is the real-time side's own slowdown:
a process's NVML share is its share of SM time, which time-slicing conserves (a request
stretched to twice its length beside a busy kernel shows half the share for twice as long),
so only a real-time process that fills whole 1/6 s samples shows a drop, and a server's
short requests never do. What it can measure is how much of the device the best-effort side
takes when it runs: each best-effort container's demand, its SM share while it computes
alone (``Container.demand_sm_ratio``, learnt from whole samples with nothing else active).
A real-time kernel runs at ``1 / (2 f2)`` of its speed while one other kernel shares the
device (``f2``: the contention curve's overhead at two, ``gpuguard/slowdown.py``; paper B's
1.08), so with best-effort demand ``u`` running ``r`` of each period, the real-time side's
mean speed is ``1 - r u c`` (``c = 1 - 1 / (2 f2)``, 0.54) and its mean slowdown
``1 / (1 - r u c)``. The run fraction is the largest whose slowdown stays within
``max_slowdown``: ``r = (1 - 1 / max_slowdown) / (u c)``, clamped to ``[floor, 1]`` and
slewed by ``max_step`` a step. The default 1.05 keeps a best-effort container that fills
the device at the floor (``r`` = 0.09 for ``u`` = 1), where open loop kept it, and lets one
that uses a fifth of it run 0.44 of each period. Why this law: the measured demand does not
depend on the run fraction (it is measured while the container runs alone), so there is no
loop to oscillate; the fraction follows the measurement in at most ``1 / max_step`` steps
and stays (a change under ``FRACTION_DEADBAND`` is the measurement's jitter: none). An
unknown demand (a container not yet seen alone for whole samples: one whose real-time
neighbour never idles) is not guessed: the fraction is ``initial`` (open loop).
The slowdown leaves out the NVML sample the best-effort side runs through before real-time
work is seen (the same for every fraction).
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
