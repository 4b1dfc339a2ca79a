"""The best-effort rate controller's law, one row per branch (as ``decide()``'s table tests)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from gpuguard.actuator.admission.ratecontrol import (
    Change,
    DutyCycle,
    RateLaw,
    RateStep,
    SloReading,
    control_step,
    next_run_fraction,
    worst_error,
)

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
