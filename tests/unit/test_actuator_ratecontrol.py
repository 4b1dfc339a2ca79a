"""The best-effort rate controller's law, one row per branch (as ``decide()``'s table tests)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from gpuguard.actuator.admission.ratecontrol import (
    CONTENTION,
    FRACTION_DEADBAND,
    Change,
    RateStep,
    SloReading,
    besteffort_demand,
    control_step,
    interference_fraction,
    interference_step,
    next_run_fraction,
    worst_error,
)
from gpuguard.actuator.decision import DutyCycle, RateLaw
from gpuguard.slowdown import slowdown_factor
from tests.unit.policy_support import container, state, task

LAW = RateLaw(floor=0.1, initial=0.2, gain=0.2, gain_up=0.05, deadband=0.1, max_step=0.2)


@pytest.mark.parametrize(
    ("current", "error", "declared", "expected", "step"),
    [
        # no SLO declared on the device: open loop at the configured fraction
        (0.7, None, False, 0.2, RateStep.OPEN_LOOP),
        (0.7, 3.0, False, 0.2, RateStep.OPEN_LOOP),
        # declared but no fresh reading: towards the floor, one slewed step at a time
        (0.7, None, True, 0.5, RateStep.STALE),
        (0.15, None, True, 0.1, RateStep.STALE),
        # within the dead band: unchanged
        (0.5, 0.1, True, 0.5, RateStep.HOLD),
        (0.5, -0.1, True, 0.5, RateStep.HOLD),
        # suffering: back off by gain x error ...
        (0.5, 0.5, True, 0.4, RateStep.DOWN),
        # ... slewed to max_step, never under the floor
        (0.5, 5.0, True, 0.3, RateStep.DOWN),
        (0.2, 5.0, True, 0.1, RateStep.DOWN),
        # room: probe up by the smaller gain, never past 1
        (0.5, -1.0, True, 0.55, RateStep.UP),
        (0.98, -1.0, True, 1.0, RateStep.UP),
    ],
)
def test_one_control_step(
    current: float, error: float | None, declared: bool, expected: float, step: RateStep
) -> None:
    fraction, why = next_run_fraction(current, error, declared, LAW)
    assert why is step
    assert fraction == pytest.approx(expected)


@pytest.mark.parametrize(
    ("attainment", "objective", "error"),
    [
        (0.99, 0.99, 0.0),  # on target
        (1.0, 0.99, -1.0),  # every request in time: the whole budget is room
        (0.98, 0.99, 1.0),  # twice the budget missed
        (0.0, 0.99, 5.0),  # clipped: one bad window cannot wind the controller up
        (0.5, 0.9, 4.0),
    ],
)
def test_error_is_normalised_to_the_budget(
    attainment: float, objective: float, error: float
) -> None:
    assert SloReading(attainment, objective, 0.0).error() == pytest.approx(error)


def test_worst_fresh_reading_governs_and_stale_ones_are_ignored() -> None:
    readings = [
        SloReading(0.995, 0.99, measured_at=100.0),  # room
        SloReading(0.97, 0.99, measured_at=100.0),  # suffering: governs
        SloReading(0.0, 0.99, measured_at=50.0),  # worse, but stale
    ]
    assert worst_error(readings, 101.0, LAW) == pytest.approx(2.0)
    assert worst_error(readings[2:], 101.0, LAW) is None
    assert worst_error([SloReading(float("nan"), 0.99, 100.0)], 101.0, LAW) is None


def test_closed_loop_converges_without_overshoot() -> None:
    """Against a static monotone plant (attainment falls as best-effort runs more), the
    fraction settles at the largest one that keeps the objective, never crossing back."""

    def plant(run: float) -> float:  # 0.999 alone, losing 0.02 per unit of run past 0.3
        return 0.999 - max(0.0, run - 0.3) * 0.02

    objective = 0.99
    run, history = LAW.initial, []
    for _ in range(200):
        error = SloReading(plant(run), objective, 0.0).error()
        run, _step = next_run_fraction(run, error, True, LAW)
        history.append(run)
    settled = history[-1]
    # the knee: plant(r) = 0.99 at r = 0.75; the dead band stops it just short of that
    assert 0.6 <= settled <= 0.75
    assert SloReading(plant(settled), objective, 0.0).error() <= LAW.deadband
    rises = [b - a for a, b in itertools.pairwise(history)]
    assert all(step >= -1e-12 for step in rises), "approached from one side, no oscillation"


def test_closed_loop_backs_off_when_the_plant_gets_worse() -> None:
    def heavy(run: float) -> float:  # a denser server: every bit of running costs
        return 0.999 - run * 0.1

    run = 1.0
    for _ in range(100):
        run, _step = next_run_fraction(run, SloReading(heavy(run), 0.99, 0).error(), True, LAW)
    assert run <= 0.2


@pytest.mark.parametrize(
    ("now", "frozen", "switch"),
    [
        (10.0, False, 10.3),  # a period starts running
        (10.29, False, 10.3),
        (10.3, True, 11.0),  # frozen for the rest of the period
        (10.99, True, 11.0),
        (11.0, False, 11.3),
    ],
)
def test_duty_cycle_runs_first_then_freezes(now: float, frozen: bool, switch: float) -> None:
    cycle = DutyCycle(run_fraction=0.3, period_s=1.0, phase=0.0)
    assert cycle.frozen_at(now) is frozen
    assert cycle.next_switch(now) == pytest.approx(switch)


def test_a_full_run_fraction_never_freezes() -> None:
    cycle = DutyCycle(run_fraction=1.0, period_s=2.0, phase=1.0)
    assert not any(cycle.frozen_at(t / 10) for t in range(100))


@pytest.mark.parametrize(
    "kwargs",
    [{"floor": 0.5, "initial": 0.2}, {"period_s": 0}, {"gain": -1}, {"floor": -0.1}],
)
def test_a_bad_law_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RateLaw(**kwargs)


# --- one control step of a device: which readings count (control_step) --------------------

T0 = 1000.0
SETTLE = RateLaw(floor=0.1, initial=0.2, gain=0.2, gain_up=0.05, deadband=0.1, max_step=0.2,
                 stale_after_s=15.0, settle_s=12.0)  # fmt: skip


def reading(attainment: float, at: float) -> SloReading:
    return SloReading(attainment, 0.99, at)


@pytest.mark.parametrize(
    ("readings", "last", "expected", "step"),
    [
        # not yet a window that shows the last change: unchanged, whatever it says
        ([reading(0.995, T0 + 5)], Change(T0), 0.5, RateStep.SETTLING),
        ([reading(0.9, T0 + 5)], Change(T0, RateStep.DOWN), 0.5, RateStep.SETTLING),
        ([reading(0.999, T0 + 5)], Change(T0, RateStep.UP), 0.5, RateStep.SETTLING),
        # a window after it: the law's step on that window alone
        ([reading(0.97, T0 + 5), reading(1.0, T0 + 12)], Change(T0), 0.55, RateStep.UP),
        ([reading(0.98, T0 + 13)], Change(T0, RateStep.DOWN), 0.3, RateStep.DOWN),
        # a miss right after a step up: the probe hurt, back off at once
        ([reading(0.985, T0 + 3)], Change(T0, RateStep.UP), 0.4, RateStep.DOWN),
        # ... but not on a window from before the step, nor within the dead band
        ([reading(0.9, T0 - 1)], Change(T0, RateStep.UP), 0.5, RateStep.SETTLING),
        ([reading(0.9895, T0 + 3)], Change(T0, RateStep.UP), 0.5, RateStep.SETTLING),
        # nothing fresh (Prometheus down, no requests): towards the floor at once
        ([reading(1.0, T0 - 10)], Change(T0 - 30), 0.3, RateStep.STALE),
        ([], Change(T0), 0.3, RateStep.STALE),
    ],
)
def test_a_control_step_uses_the_readings_that_show_the_last_change(
    readings: list[SloReading], last: Change, expected: float, step: RateStep
) -> None:
    fraction, why = control_step(0.5, readings, True, last, T0 + 14, SETTLE)
    assert why is step
    assert fraction == pytest.approx(expected)


def test_no_reading_yet_is_settling_until_stale_after_from_the_start_of_control() -> None:
    fraction, why = control_step(0.5, [], True, Change(T0), T0 + 14, SETTLE, since=T0)
    assert (fraction, why) == (0.5, RateStep.SETTLING)
    fraction, why = control_step(0.5, [], True, Change(T0), T0 + 15, SETTLE, since=T0)
    assert (fraction, why) == (pytest.approx(0.3), RateStep.STALE)


def test_without_a_declared_slo_a_step_is_open_loop() -> None:
    fraction, why = control_step(0.5, [reading(0.5, T0)], False, Change(0), T0, SETTLE)
    assert (fraction, why) == (SETTLE.initial, RateStep.OPEN_LOOP)


def _delayed_loop(law: RateLaw, steps: int, slope: float) -> list[float]:
    """The law at one step a second against a plant that answers through a 10 s window
    read 2 s late (a Prometheus rule): attainment = f(the mean run fraction over it)."""
    history: list[float] = []
    readings: list[SloReading] = []
    run, last = law.initial, Change(0.0)
    for t in range(steps):
        history.append(run)
        if t >= 12:
            window = history[t - 12 : t - 2]
            mean = sum(window) / len(window)
            readings.append(SloReading(0.999 - max(0.0, mean - 0.3) * slope, 0.99, float(t)))
        fraction, step = control_step(run, readings[-1:], True, last, float(t), law)
        if fraction != run:
            last = Change(float(t), step)
        run = fraction
    return history


@pytest.mark.parametrize("slope", [0.02, 0.05, 0.2])
def test_settling_keeps_a_lagging_signal_from_overshooting(slope: float) -> None:
    """Why ``settle_s``: the same gains stepping on every reading of a lagging signal
    overshoot the knee and swing; waiting for a window that shows the last change does not,
    however steep the plant (a dense server's is ten times a sparse one's)."""
    knee = 0.3 + 0.009 / slope  # attainment = objective there
    eager = _delayed_loop(replace(SETTLE, settle_s=0.0), 400, slope)
    patient = _delayed_loop(SETTLE, 400, slope)
    assert max(eager) > knee + 0.1, "stepping on every reading overshoots"
    if slope >= 0.05:  # a steep plant: it never settles
        assert max(eager[200:]) - min(eager[200:]) > 0.3
    # settled steps rise to the knee from below and stay (the first step: stale, to the floor)
    assert all(b >= a for a, b in itertools.pairwise(patient[1:]))
    assert knee - 0.1 <= patient[-1] <= knee + 0.01


# --- without a declared SLO: the interference law --------------------------------------

INTERFERENCE = RateLaw(floor=0.1, initial=0.2, max_step=0.2, max_slowdown=1.05)


def test_the_contention_constant_is_the_curves_at_two_kernels() -> None:
    # paper B: two concurrent matmuls take 23.271 s against 10.795 s alone, so each runs at
    # 10.795 / 23.271 of its speed and loses the rest
    assert pytest.approx(1 - 10.795 / 23.271) == CONTENTION
    assert pytest.approx(1 - 1 / (2 * slowdown_factor(2))) == CONTENTION


@pytest.mark.parametrize(
    ("demand", "max_slowdown", "expected"),
    [
        # a best-effort side that fills the device: the floor (0.089 wanted), as open loop
        (1.0, 1.05, 0.1),
        (1.7, 1.05, 0.1),  # two in phase that each fill it: no more than one
        # a fifth of the device: (1 - 1/1.05) / (0.2 x 0.536) = 0.444
        (0.2, 1.05, (1 - 1 / 1.05) / (0.2 * CONTENTION)),
        # a looser bound lets the same container run more
        (0.2, 1.2, 1.0),
        (0.5, 1.2, (1 - 1 / 1.2) / (0.5 * CONTENTION)),
        # nothing computing: no interference, it may run all the time
        (0.0, 1.05, 1.0),
        (-0.1, 1.05, 1.0),  # never below nothing
    ],
)
def test_the_largest_fraction_within_the_slowdown_bound(
    demand: float, max_slowdown: float, expected: float
) -> None:
    law = replace(INTERFERENCE, max_slowdown=max_slowdown)
    fraction = interference_fraction(demand, law)
    assert fraction == pytest.approx(expected)
    assert law.floor <= fraction <= 1
    if law.floor < fraction < 1:  # inside the clamp it is exactly the bound
        slowdown = 1 / (1 - fraction * min(1.0, demand) * CONTENTION)
        assert slowdown == pytest.approx(max_slowdown)


@pytest.mark.parametrize(
    ("current", "demand", "max_slowdown", "expected", "step"),
    [
        # demand unknown, or the bound off: open loop at the configured fraction
        (0.7, None, 1.05, 0.2, RateStep.OPEN_LOOP),
        (0.7, 0.2, 0.0, 0.2, RateStep.OPEN_LOOP),
        # towards the law's fraction by at most max_step a step
        (0.2, 0.2, 1.05, 0.4, RateStep.UP),
        (0.4, 0.2, 1.05, (1 - 1 / 1.05) / (0.2 * CONTENTION), RateStep.UP),
        (0.9, 1.0, 1.05, 0.7, RateStep.DOWN),
        (0.15, 1.0, 1.05, 0.1, RateStep.DOWN),
        # there already, or within the demand's jitter of it: held
        (0.1, 1.0, 1.05, 0.1, RateStep.HOLD),
        (1.0, 0.0, 1.05, 1.0, RateStep.HOLD),
        (0.105, 0.84, 1.05, 0.105, RateStep.HOLD),  # 0.106 wanted
        (0.43, 0.2, 1.05, 0.43, RateStep.HOLD),  # 0.444 wanted
    ],
)
def test_one_interference_step(
    current: float, demand: float | None, max_slowdown: float, expected: float, step: RateStep
) -> None:
    law = replace(INTERFERENCE, max_slowdown=max_slowdown)
    fraction, why = interference_step(current, demand, law)
    assert why is step
    assert fraction == pytest.approx(expected)


def test_the_interference_law_settles_without_overshoot_and_stays() -> None:
    """The demand does not depend on the fraction: the law reaches its fraction from either
    side, monotonically, within 1 / max_step steps, and holds there."""
    for start, demand in itertools.product((0.1, 0.5, 1.0), (0.05, 0.2, 0.6, 1.0)):
        target = interference_fraction(demand, INTERFERENCE)
        fraction, trail = start, [start]
        for _ in range(10):
            fraction, _ = interference_step(fraction, demand, INTERFERENCE)
            trail.append(fraction)
        assert abs(trail[-1] - target) < FRACTION_DEADBAND
        moves = [b - a for a, b in itertools.pairwise(trail)]
        assert all(m >= -1e-12 for m in moves) or all(m <= 1e-12 for m in moves), trail
        assert trail[6:] == [trail[-1]] * len(trail[6:]), trail


def test_a_devices_demand_is_its_managed_best_effort_containers_summed() -> None:
    snap = state(
        [
            container("rt", klass="real-time", demand=0.9),
            container("be-a", klass="best-effort", demand=0.15),
            container("be-b", klass="best-effort", demand=0.25),
            container("be-c", klass="best-effort", demand=None),
            container("be-free", klass="best-effort", demand=0.8, managed=False),
        ],
        [
            task("rt", "computing", 1, gpu=0),
            task("be-a", "computing", 2, gpu=0),
            task("be-a", "computing", 3, gpu=0, pid=4242),  # a second process: counted once
            task("be-b", "computing", 4, gpu=0),
            task("be-c", "computing", 5, gpu=1),
            task("be-a", "computing", 6, gpu=2),
            task("be-free", "computing", 7, gpu=2),  # not ours to freeze: not in the cycle
        ],
        gpus=3,
    )
    demand = besteffort_demand(snap)
    assert demand[(0, None)] == pytest.approx(0.4)
    assert demand[(1, None)] is None  # one of them not yet seen alone: unknown
    assert demand[(2, None)] == pytest.approx(0.15)
    assert set(demand) == {(0, None), (1, None), (2, None)}
