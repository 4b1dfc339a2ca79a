"""The actuator's memory for holds and windows (gpuguard/actuator/admission/history.py)
and its due timer."""

from __future__ import annotations

import threading
import time

import pytest

from gpuguard.actuator.admission.history import RecentHistory
from gpuguard.actuator.admission.ratecontrol import RateStep, SloReading, interference_fraction
from gpuguard.actuator.decision import (
    Decision,
    DutyCycle,
    PolicyConfig,
    RateLaw,
)
from gpuguard.actuator.state import Container, ExporterState, Task
from gpuguard.actuator.timer import DueTimer
from gpuguard.contract import Phase

CONFIG = PolicyConfig()
T = "t" * 64


def test_real_time_devices_are_remembered_with_the_decision_time() -> None:
    history = RecentHistory(CONFIG)
    history.observe(Decision(realtime_devices=frozenset({(0, None)})), [], 100.0)
    history.observe(Decision(realtime_devices=frozenset({(1, 2)})), [], 101.0)
    assert history.snapshot(101.0).realtime_seen == {(0, None): 100.0, (1, 2): 101.0}


def test_the_measured_freeze_moves_the_estimate_towards_it() -> None:
    history = RecentHistory(CONFIG)
    before = history.snapshot(100.0).freeze_s
    history.observe(Decision(), [], 100.0, [0.011, None])
    after = history.snapshot(100.0).freeze_s
    assert before < after < 0.011  # a moving average: one slow freeze moves it part way
    for _ in range(50):
        history.observe(Decision(), [], 100.0, [0.011])
    assert history.snapshot(100.0).freeze_s == pytest.approx(0.011, rel=1e-3)


def test_a_program_serves_when_new_tasks_begin_computing_right_after_a_drain() -> None:
    # the same task computing again after a drain (a light task's host work, a sample that
    # flickers) goes straight on but serves nothing; a new task first seen computing right
    # after the last one drained does, and seen twice it is what servers do (a short input
    # phase no decision happened to see is once)
    from gpuguard.actuator.admission.history import REPEATER_MEMORY_S

    history = RecentHistory(CONFIG)
    history.saw(snap([("c1", "t1", "computing")]), 100.0)
    history.saw(snap([("c1", "t1", "draining")]), 100.2)
    history.saw(snap([("c1", "t1", "computing")]), 100.4)
    recent = history.snapshot(100.4)
    assert recent.straight_on == {"c1"} and recent.serving == frozenset()
    history.saw(snap([("c1", "t1", "draining")]), 100.6)
    history.saw(snap([("c1", "t2", "computing")]), 101.0)
    assert history.snapshot(101.0).serving == frozenset()  # once
    history.saw(snap([("c1", "t2", "draining")]), 101.2)
    history.saw(snap([("c1", "t3", "input")]), 101.4)  # its input shows: not at once
    history.saw(snap([("c1", "t3", "draining")]), 101.8)
    history.saw(snap([("c1", "t4", "computing")]), 104.0)  # too long after the drain
    assert history.snapshot(104.0).serving == frozenset()
    history.saw(snap([("c1", "t4", "draining")]), 104.2)
    history.saw(snap([("c1", "t5", "computing")]), 104.5)
    assert history.snapshot(104.5).serving == {"c1"}
    # forgotten when the container leaves, or REPEATER_MEMORY_S after it last showed it
    later = 104.6 + REPEATER_MEMORY_S
    history.saw(snap([("c1", "t6", "input")]), later)
    assert history.snapshot(later).serving == frozenset()
    history.saw(snap([("c1", "t6", "draining")]), later + 0.2)
    history.saw(snap([("c1", "t7", "computing")]), later + 0.4)
    history.saw(snap([("c1", "t7", "draining")]), later + 0.6)
    history.saw(snap([("c1", "t8", "computing")]), later + 0.8)
    assert history.snapshot(later + 0.8).serving == {"c1"}
    history.saw(snap([], gone=("c1",)), later + 1.0)
    assert history.snapshot(later + 1.0).serving == frozenset()


def test_due_timer_calls_back_at_the_due_time_and_only_the_latest_counts() -> None:
    fired: list[float] = []
    done = threading.Event()

    def callback() -> None:
        fired.append(time.time())
        done.set()

    timer = DueTimer(callback)
    timer.start()
    try:
        timer.at(time.time() + 30)  # replaced before it falls due
        due = time.time() + 0.2
        timer.at(due)
        assert done.wait(5)
        assert fired[0] >= due - 0.01
        assert timer.due is None
        timer.at(None)
        time.sleep(0.3)
        assert len(fired) == 1
    finally:
        timer.stop()


def snap(tasks: list[tuple[str, str, str]], gone: tuple[str, ...] = ()) -> ExporterState:
    """Containers c1.. of image img running ``(container, task id, phase)`` tasks."""
    names = sorted({c for c, _, _ in tasks} | set(gone))
    containers = tuple(
        Container(
            n, n, False, True, None, 5.0, image="img", state="exited" if n in gone else "running"
        )
        for n in names
    )
    running = tuple(
        Task(tid, c, c, 1, 0, Phase(phase), 0.0, 1.0, 1, 0.5, 5.0, 5.0, False)
        for c, tid, phase in tasks
    )
    return ExporterState("n", 1, 0.0, {}, (), containers, running)


def test_what_a_program_does_after_a_task_is_learnt_per_container_and_image() -> None:
    history = RecentHistory(CONFIG)
    c1 = ("c1", "t2", "computing")
    history.saw(snap([("c1", "t1", "computing")]), 100.0)
    history.saw(snap([("c1", "t1", "draining")]), 100.5)
    history.saw(snap([c1]), 101.0)  # computing again at once: it goes straight on
    assert history.snapshot(101.0).straight_on == {"c1"}
    # c2, of the same image, is taken to go straight on before it shows it itself
    history.saw(snap([c1, ("c2", "t3", "input")]), 101.5)
    assert history.snapshot(101.5).straight_on == {"c1", "c2"}
    # c3 leaves after a single task: a new container of the image is now taken for a
    # one-shot; c1 keeps what it showed itself
    history.saw(snap([c1, ("c3", "t4", "computing")]), 102.0)
    history.saw(snap([c1], gone=("c3",)), 103.0)
    history.saw(snap([c1, ("c4", "t5", "input")]), 103.5)
    assert history.snapshot(103.5).straight_on == {"c1"}
    # a next task whose input shows does not go straight on
    history.saw(snap([c1, ("c4", "t5", "draining")]), 104.0)
    history.saw(snap([c1, ("c4", "t6", "input")]), 104.4)
    assert history.snapshot(104.4).straight_on == {"c1"}
    # nor does it undo what a container showed before (a re-allocation across a poll, now
    # and then), or what its image last showed
    history.saw(snap([("c1", "t2", "draining")]), 105.0)
    history.saw(snap([("c1", "t7", "input")]), 105.4)
    history.saw(snap([("c1", "t7", "input"), ("c5", "t8", "input")]), 105.5)
    assert history.snapshot(105.5).straight_on == {"c1"}


# --- rate control's state (RateHistory) ------------------------------------------------------

GPU0 = (0, None)


def rate_history(**law: float) -> RecentHistory:
    config = PolicyConfig(rate=RateLaw(**law))
    return RecentHistory(config)


def run_cycles(history: RecentHistory, cycles: dict[tuple[int, int | None], DutyCycle]) -> None:
    history.observe(Decision(duty_cycles=cycles), [], 0.0)


def test_a_cycle_a_decision_ran_keeps_its_phase_until_one_runs_none() -> None:
    history = rate_history(initial=0.3)
    run_cycles(history, {GPU0: DutyCycle(0.3, 1.0, 99.7)})
    assert history.snapshot(100.0).duty_cycles == {GPU0: DutyCycle(0.3, 1.0, 99.7)}
    history.observe(Decision(), [], 100.5)  # not planned (stale state, hold): unchanged
    assert GPU0 in history.snapshot(100.5).duty_cycles
    run_cycles(history, {})  # real-time work went idle
    snap = history.snapshot(101.0)
    assert snap.duty_cycles == {} and snap.run_fractions == {GPU0: 0.3}


def test_one_control_step_a_period_and_only_where_a_cycle_runs() -> None:
    history = rate_history(initial=0.5, floor=0.1, max_step=0.2, period_s=1.0, stale_after_s=3)
    assert history.rates.control({}, frozenset({GPU0}), 100.0) == []  # no cycle yet
    run_cycles(history, {GPU0: DutyCycle(0.5, 1.0, 99.5)})
    # declared, no reading yet: a first window takes a while, stale only after stale_after
    [step] = history.rates.control({}, frozenset({GPU0}), 100.0)
    assert (step.step, step.run_fraction, step.changed) == (RateStep.SETTLING, 0.5, False)
    assert history.rates.control({}, frozenset({GPU0}), 100.5) == []  # within the period
    [step] = history.rates.control({}, frozenset({GPU0}), 103.0)
    assert (step.step, step.run_fraction, step.changed) == (RateStep.STALE, 0.3, True)
    [step] = history.rates.control({}, frozenset({GPU0}), 104.0)
    assert step.run_fraction == pytest.approx(0.1)
    # the running cycle takes the new fraction, in the same phase
    assert history.snapshot(104.0).duty_cycles[GPU0] == DutyCycle(step.run_fraction, 1.0, 99.5)
    [step] = history.rates.control({}, frozenset(), 105.0)  # nothing declared: open loop
    assert (step.step, step.run_fraction) == (RateStep.OPEN_LOOP, 0.5)
    # a cycle that ends and starts again gives its first window time again
    run_cycles(history, {})
    run_cycles(history, {GPU0: DutyCycle(0.5, 1.0, 109.5)})
    [step] = history.rates.control({}, frozenset({GPU0}), 110.0)
    assert step.step == RateStep.SETTLING


def test_without_an_slo_the_measured_demand_sets_the_fraction_and_says_so() -> None:
    history = rate_history(initial=0.1, floor=0.1, max_step=0.2, period_s=1.0)
    run_cycles(history, {GPU0: DutyCycle(0.1, 1.0, 99.9)})
    # not yet seen alone: open loop at the initial fraction
    [step] = history.rates.control({}, frozenset(), 100.0, {GPU0: None})
    assert (step.step, step.run_fraction, step.signal) == (RateStep.OPEN_LOOP, 0.1, "none")
    # a light trainer (a fifth of the device): up one slewed step a period, to the bound
    [step] = history.rates.control({}, frozenset(), 101.0, {GPU0: 0.2})
    assert (step.step, step.signal) == (RateStep.UP, "interference")
    assert step.run_fraction == pytest.approx(0.3)
    [step] = history.rates.control({}, frozenset(), 102.0, {GPU0: 0.2})
    [step] = history.rates.control({}, frozenset(), 103.0, {GPU0: 0.2})
    assert step.run_fraction == pytest.approx(interference_fraction(0.2, history.rates.law))
    assert history.snapshot(103.0).duty_cycles[GPU0].run_fraction == step.run_fraction
    # a declared SLO takes over from the demand
    [step] = history.rates.control({}, frozenset({GPU0}), 104.0, {GPU0: 0.2})
    assert step.signal == "slo"


def test_a_step_waits_for_a_reading_taken_after_the_last_change_has_settled() -> None:
    history = rate_history(initial=0.5, gain_up=0.1, settle_s=5.0, period_s=1.0)
    run_cycles(history, {GPU0: DutyCycle(0.5, 1.0, 0.0)})
    good = {GPU0: [SloReading(1.0, 0.99, 100.0)]}
    [step] = history.rates.control(good, frozenset({GPU0}), 100.0)  # the first look
    assert step.step == RateStep.SETTLING  # nothing changed since: the clock starts now
    [step] = history.rates.control(good, frozenset({GPU0}), 104.0)
    assert step.step == RateStep.SETTLING  # reading older than the first look + 5 s
    later = {GPU0: [SloReading(1.0, 0.99, 105.0)]}
    [step] = history.rates.control(later, frozenset({GPU0}), 105.0)
    assert (step.step, step.run_fraction) == (RateStep.UP, pytest.approx(0.6))
    [step] = history.rates.control(later, frozenset({GPU0}), 106.0)
    assert step.step == RateStep.SETTLING  # the step up is the new last change


def trainer_step(start: float, end: float) -> ExporterState:
    """A best-effort trainer whose newest step seen whole ran from ``start`` to ``end``."""
    from gpuguard.actuator.state import Activity
    from gpuguard.contract import PriorityClass

    trainer = Container(
        "tr", "tr", False, True, None, None, priority_class=PriorityClass.BEST_EFFORT,
        activity=Activity("launch", busy=True, last_step=(start, end)),
    )  # fmt: skip
    return ExporterState("n", 1, 0.0, {}, (), (trainer,), ())


def test_a_best_effort_step_counts_only_if_it_ran_unfrozen() -> None:
    from gpuguard.actuator.decision import PAUSE, UNPAUSE, Step
    from gpuguard.contract import Result, StepReason

    history = RecentHistory(CONFIG)
    freeze = Step(PAUSE, "tr", "tr", StepReason.BEST_EFFORT)
    thaw = Step(UNPAUSE, "tr", "tr", StepReason.REALTIME_IDLE)
    history.saw(trainer_step(10.00, 10.04), 10.05)
    assert history.snapshot(10.05).steps == {"tr": pytest.approx(0.04)}
    history.observe(Decision(), [(freeze, Result.OK)], 10.10)  # frozen inside its next step
    history.observe(Decision(), [(thaw, Result.OK)], 10.60)
    history.saw(trainer_step(10.08, 10.61), 10.62)  # that step: the freeze inside it
    assert history.snapshot(10.62).steps == {"tr": pytest.approx(0.04)}  # not learnt
    history.saw(trainer_step(10.61, 10.66), 10.70)  # begun after the thaw, run unfrozen
    history.saw(trainer_step(10.61, 10.66), 10.75)  # the same step read again: once
    assert history.snapshot(10.75).steps == {"tr": pytest.approx(0.05)}  # the longest kept
    history.observe(Decision(), [(freeze, Result.SKIPPED)], 10.80)  # not frozen: no freeze
    history.saw(trainer_step(10.76, 10.82), 10.83)
    assert history.snapshot(10.83).steps == {"tr": pytest.approx(0.06)}
    history.forget(set())
    assert history.snapshot(11.0).steps == {}


def test_a_best_effort_containers_runs_are_kept_from_its_first_sighting() -> None:
    from gpuguard.actuator.decision import PAUSE, UNPAUSE, Step
    from gpuguard.contract import Result, StepReason

    history = RecentHistory(CONFIG)  # the floor's window: ten 1 s periods
    freeze = Step(PAUSE, "tr", "tr", StepReason.BEST_EFFORT)
    thaw = Step(UNPAUSE, "tr", "tr", StepReason.REALTIME_IDLE)
    realtime = Step(PAUSE, "rt", "rt", StepReason.NEWCOMER)
    history.saw(trainer_step(0.0, 0.04), 1.0)  # first seen: it runs from here
    history.observe(Decision(), [(freeze, Result.OK), (realtime, Result.OK)], 3.0)
    history.observe(Decision(), [(freeze, Result.ALREADY)], 3.5)  # frozen already: no run
    history.observe(Decision(), [(thaw, Result.OK)], 4.0)
    history.observe(Decision(), [(freeze, Result.SKIPPED)], 4.5)  # not frozen: runs on
    history.observe(Decision(), [(freeze, Result.OK)], 6.0)
    assert history.snapshot(6.0).runs == {"tr": ((1.0, 3.0), (4.0, 6.0))}  # no real-time runs
    assert history.snapshot(13.5).runs == {"tr": ((4.0, 6.0),)}  # ended before the window
    history.forget(set())
    assert history.snapshot(14.0).runs == {}


def on_gpu(
    tasks: list[tuple[str, str, str, float]],
    idle: tuple[str, ...] = (),
    paused: tuple[str, ...] = (),
) -> ExporterState:
    """Containers on GPU 0: ``idle`` ones with no task, the others running ``(container,
    task id, phase, started_at)``; ``paused`` ones paused."""
    names = sorted({c for c, _, _, _ in tasks} | set(idle))
    containers = tuple(
        Container(n, n, n in paused, True, None, 5.0, image="img", devices=((0, None),))
        for n in names
    )
    running = tuple(
        Task(tid, c, c, 1, 0, Phase(phase), at, 0.1, 1, 0.5, 5.0, at + 5.0, c in paused)
        for c, tid, phase, at in tasks
    )
    return ExporterState("n", 1, 0.0, {}, (), containers, running)


def test_a_program_that_sat_on_the_gpu_before_its_first_kernel_started_idle() -> None:
    # s loads its model (an input phase that never reaches a kernel) and waits for its
    # first request: a server's start-up, known once it has sat 1 s. o's first kernel
    # comes 0.5 s after its process (a one-shot), q's after 0.9 s; p waits 1.5 s in its
    # input phase, but paused by admission (a one-shot held behind another), then computes
    history = RecentHistory(CONFIG)
    first = [("s", "s1", "input", 100.0), ("o", "o1", "input", 100.0)]
    history.saw(on_gpu([*first, ("p", "p1", "input", 100.0)], ("q",), paused=("p",)), 100.0)
    history.saw(on_gpu([("s", "s1", "input", 100.0), ("o", "o1", "computing", 100.0),
                        ("p", "p1", "input", 100.0)], ("q",), paused=("p",)), 100.5)  # fmt: skip
    history.saw(on_gpu([("q", "q1", "computing", 100.9), ("p", "p1", "input", 100.0)],
                       ("s", "o"), paused=("p",)), 100.9)  # fmt: skip
    assert history.snapshot(100.9).started_idle == frozenset()
    history.saw(on_gpu([("p", "p1", "input", 100.0)], ("s", "o", "q"), paused=("p",)), 101.5)
    assert history.snapshot(101.5).started_idle == {"s"}
    history.saw(on_gpu([("p", "p1", "computing", 100.0)], ("s", "o", "q")), 101.6)
    # learnt once: o's, p's and q's later waits do not make them servers
    history.saw(on_gpu([], ("s", "o", "p", "q")), 103.0)
    history.saw(on_gpu([("o", "o2", "computing", 104.0)], ("s", "p", "q")), 104.1)
    assert history.snapshot(104.1).started_idle == {"s"}
    history.forget({"o", "q"})
    assert history.snapshot(104.2).started_idle == frozenset()
