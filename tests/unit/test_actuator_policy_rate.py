"""Table tests of best-effort under rate control (real-time work seen through NVML only,
``policy/besteffort.py``'s ``plan_best_effort_rate``), as ``test_actuator_policy.py``'s."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuguard.actuator.admission.policy.decide import decide
from gpuguard.actuator.admission.policy.edges import NVML_SAMPLE_S
from gpuguard.actuator.decision import (
    PAUSE,
    UNPAUSE,
    Decision,
    DutyCycle,
    Ledger,
    PolicyConfig,
    RateLaw,
    Recent,
    Trigger,
)
from gpuguard.actuator.state import DeviceKey, EndedTask
from tests.unit.policy_support import NOW, acts, cid, container, ours, reasons, state, task

BE = "best-effort"
GPU0: DeviceKey = (0, None)
LAW = RateLaw(period_s=1.0, floor=0.1, initial=0.3)
RATE = PolicyConfig(rate=LAW)


def run(
    st: Any,
    ledger: Ledger | None = None,
    recent: Recent | None = None,
    pressure: frozenset[DeviceKey] = frozenset(),
    now: float = NOW,
    config: PolicyConfig = RATE,
) -> Decision:
    return decide(st, Trigger("fast", now), config, ledger, recent, pressure)


def cycle(run_fraction: float = 0.3, into: float = 0.0) -> Recent:
    """A duty cycle running on GPU 0, ``into`` seconds into its current period."""
    return Recent(duty_cycles={GPU0: DutyCycle(run_fraction, LAW.period_s, NOW - into)})


def serving() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A real-time server computing on GPU 0 beside a managed best-effort trainer."""
    cs = [container("r", deadline=2.0), container("t", klass=BE)]
    return cs, [task("r", "computing", 1, sm=0.4), task("t", "computing", 2, sm=0.6)]


def test_a_new_cycle_starts_frozen_at_the_controllers_fraction() -> None:
    cs, ts = serving()
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [(PAUSE, "t")] and d.steps[0].reason == "duty_cycle"
    assert d.duty_cycles is not None
    [(device, started)] = d.duty_cycles.items()
    assert device == GPU0 and started.run_fraction == LAW.initial
    assert started.frozen_at(NOW)
    assert d.next_due == pytest.approx(NOW + (1 - LAW.initial) * LAW.period_s)
    # the fraction the controller learnt for the device, not --besteffort.initial
    d = run(state(cs, ts, util=1.0), recent=Recent(run_fractions={GPU0: 0.6}))
    assert d.duty_cycles is not None and d.duty_cycles[GPU0].run_fraction == 0.6
    assert d.next_due == pytest.approx(NOW + 0.4)


@pytest.mark.parametrize(
    ("into", "paused", "expected", "due_in"),
    [
        (0.0, True, [(UNPAUSE, "t")], 0.3),  # its period begins: it runs
        (0.2, True, [(UNPAUSE, "t")], 0.1),
        (0.2, False, [], 0.1),  # running in its run part: left alone
        (0.3, False, [(PAUSE, "t")], 0.7),  # the run part is over
        (0.9, True, [], 0.1),  # frozen for the rest of the period
    ],
)
def test_best_effort_follows_its_devices_duty_cycle(
    into: float, paused: bool, expected: list[tuple[str, str]], due_in: float
) -> None:
    cs, ts = serving()
    ledger = ours("t") if paused else None
    d = run(state(cs, ts, util=1.0), ledger, cycle(0.3, into))
    assert acts(d) == expected
    assert all(s.reason == "duty_cycle" for s in d.steps)
    assert d.next_due == pytest.approx(NOW + due_in)
    assert d.duty_cycles == {GPU0: DutyCycle(0.3, 1.0, NOW - into)}  # the same phase


def test_every_best_effort_container_of_a_device_is_in_phase() -> None:
    cs, ts = serving()
    cs.append(container("u", klass=BE))
    ts.append(task("u", "computing", 3, pid=77))
    assert acts(run(state(cs, ts, util=1.0), recent=cycle(0.3, 0.5))) == [
        (PAUSE, "t"),
        (PAUSE, "u"),
    ]
    d = run(state(cs, ts, util=1.0), Ledger(paused={cid("t"): NOW - 1, cid("u"): NOW - 1}),
            cycle(0.3, 0.1))  # fmt: skip
    assert acts(d) == [(UNPAUSE, "t"), (UNPAUSE, "u")]


def test_a_container_on_two_devices_runs_only_where_both_cycles_run() -> None:
    cs = [container("r", deadline=2.0), container("s", deadline=2.0), container("t", klass=BE)]
    ts = [task("r", "computing", 1, gpu=0), task("s", "computing", 2, gpu=1, pid=8)]
    ts += [task("t", "computing", 3, gpu=0, pid=9), task("t", "computing", 3, gpu=1, pid=9)]
    recent = Recent(
        duty_cycles={
            GPU0: DutyCycle(0.8, 1.0, NOW - 0.5),
            (1, None): DutyCycle(0.3, 1.0, NOW - 0.5),
        }
    )
    d = run(state(cs, ts, util=1.0, gpus=2), ours("t"), recent)
    assert acts(d) == []  # GPU 0's cycle runs, GPU 1's is frozen: so is it
    assert d.next_due == pytest.approx(NOW + 0.3)  # GPU 0's switch comes first
    recent = Recent(duty_cycles={**recent.duty_cycles, (1, None): DutyCycle(0.3, 1.0, NOW)})
    assert acts(run(state(cs, ts, util=1.0, gpus=2), ours("t"), recent)) == [(UNPAUSE, "t")]


def test_one_sample_is_the_devices_learnt_period() -> None:
    """An H200 samples its processes every 0.2 s: real-time work seen 0.18 s ago may still
    run unseen there, where 1/6 s would have thawed the trainer into it."""
    cs = [container("r", deadline=2.0), container("t", klass=BE, paused=True)]
    ts = [task("r", "draining", 1), task("t", "computing", 2, paused=True)]
    seen = Recent(realtime_seen={GPU0: NOW - 0.18})
    assert acts(run(state(cs, ts), ours("t"), seen)) == [(UNPAUSE, "t")]
    d = run(state(cs, ts, sample_period_s=0.2), ours("t"), seen)
    assert acts(d) == [] and d.next_due == pytest.approx(NOW + 0.02)


def test_real_time_idle_thaws_after_one_nvml_sample_without_an_adaptive_hold() -> None:
    cs = [container("r", deadline=2.0), container("t", klass=BE, paused=True)]
    ts = [task("r", "draining", 1), task("t", "computing", 2, paused=True)]
    seen = Recent(realtime_seen={GPU0: NOW - 0.1})
    d = run(state(cs, ts), ours("t"), seen)
    assert acts(d) == [] and d.next_due == pytest.approx(NOW - 0.1 + NVML_SAMPLE_S)
    later = replace(seen, realtime_seen={GPU0: NOW - 0.2})
    d = run(state(cs, ts), ours("t"), later)
    assert acts(d) == [(UNPAUSE, "t")] and d.steps[0].reason == "realtime_idle"
    # never frozen for idle real-time work, however the last freeze went
    cs[1]["paused"] = False
    ts[1]["paused"] = False
    assert acts(run(state(cs, ts), None, seen)) == []


def test_a_cycle_outlives_an_idle_gap_shorter_than_a_period() -> None:
    # work that comes back at once continues the cycle (a new one would start frozen while
    # the last freeze still holds: longer than the floor allows); after a period, afresh
    cs = [container("r", deadline=2.0), container("t", klass=BE, paused=True)]
    ts = [task("r", "draining", 1), task("t", "computing", 2, paused=True)]
    running = cycle(0.3, 0.5)
    d = run(state(cs, ts), ours("t"), replace(running, realtime_seen={GPU0: NOW - 0.9}))
    assert d.duty_cycles == running.duty_cycles
    d = run(state(cs, ts), ours("t"), replace(running, realtime_seen={GPU0: NOW - 1.0}))
    assert d.duty_cycles == {}
    # back within the period: still in the run part of the same cycle, it runs on
    cs, ts = serving()
    d = run(state(cs, ts, util=1.0), ours("t"), cycle(0.3, 1.1))
    assert acts(d) == [(UNPAUSE, "t")]


def test_a_light_server_whose_requests_merge_is_rate_controlled_like_any_other() -> None:
    cs = [container("r", deadline=0.3, demand=0.4), container("t", klass=BE)]
    ts = [task("r", "computing", 1, sm=0.4), task("t", "computing", 2, sm=0.6)]
    merged = EndedTask(cid("r"), NOW - 9, NOW - 2, gpu=0, boundary="merged")
    st = replace(state(cs, ts, util=1.0), recent=(merged,))
    d = run(st)
    assert acts(d) == [(PAUSE, "t")] and d.realtime_devices == frozenset({GPU0})


def test_under_slo_pressure_the_cycle_runs_between_requests_too() -> None:
    cs = [container("r", deadline=2.0), container("t", klass=BE)]
    ts = [task("t", "computing", 2)]  # the server is between requests
    assert acts(run(state(cs, ts))) == []
    d = run(state(cs, ts), pressure=frozenset({GPU0}))
    assert acts(d) == [(PAUSE, "t")] and d.steps[0].reason == "duty_cycle"
    d = run(state(cs, ts), ours("t"), cycle(0.3, 0.1), frozenset({GPU0}))
    assert acts(d) == [(UNPAUSE, "t")]  # its floor: pressure never starves it


def test_best_effort_that_cannot_be_paused_is_skipped_and_runs_no_cycle() -> None:
    cs, ts = serving()
    cs[1]["managed"] = False
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [] and "unmanaged" in reasons(d)
    assert d.duty_cycles == {}


def test_a_best_effort_container_paused_by_someone_else_is_never_thawed() -> None:
    cs, ts = serving()
    cs[1]["paused"] = True
    ts[1]["paused"] = True
    assert acts(run(state(cs, ts, util=1.0), None, cycle(0.3, 0.1))) == []


def test_a_full_run_fraction_never_freezes() -> None:
    cs, ts = serving()
    d = run(state(cs, ts, util=1.0), recent=Recent(run_fractions={GPU0: 1.0}))
    assert acts(d) == [] and d.next_due == pytest.approx(NOW + 1.0)
