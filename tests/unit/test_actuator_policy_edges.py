"""Table tests of decisions on busy/idle edges (containers seen through the launch probe or
their own in-flight gauge, ``policy/edges.py``), as ``test_actuator_policy.py``'s: one per
branch, exact and NVML-only work on one device included."""

from __future__ import annotations

from typing import Any

import pytest

from gpuguard.actuator.admission.policy.besteffort import floor_due_at
from gpuguard.actuator.admission.policy.decide import decide
from gpuguard.actuator.admission.policy.edges import (
    NVML_SAMPLE_S,
    declared_devices,
    devices_of,
    edge_phase,
    edges_of,
    thaw_after_s,
)
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
from gpuguard.actuator.state import DeviceKey, Gpu, parse_state
from gpuguard.statedoc import StateError
from tests.unit.policy_support import NOW, acts, cid, container, ours, reasons, seen, state, task

BE = "best-effort"
GPU0: DeviceKey = (0, None)
LAW = RateLaw(period_s=1.0, floor=0.1, initial=0.3)
RATE = PolicyConfig(rate=LAW)


def run(
    st: Any, ledger: Ledger | None = None, recent: Recent | None = None, now: float = NOW
) -> Decision:
    return decide(st, Trigger("fast", now), RATE, ledger, recent)


def beside(rt_busy: bool, last: tuple[float, float] | None = None) -> Any:
    """A real-time server seen by the probe beside a best-effort trainer, both on GPU 0."""
    cs = [seen(container("r", deadline=2.0), busy=rt_busy, last=last), container("t", klass=BE)]
    phase = "computing" if rt_busy else "draining"
    return state(cs, [task("r", phase, 1, sm=0.4), task("t", "computing", 2, sm=0.6)], util=1.0)


# --- the exporter's activity as the actuator reads it ---------------------------------------


def test_activity_is_parsed_and_an_exporter_without_it_still_reads() -> None:
    cs = [seen(container("r"), busy=True, last=(NOW - 2, NOW - 1)), container("t")]
    cs.append(seen(container("g"), source="gauge", inflight=2))
    st = state(cs, [])
    r, t, g = (st.container(cid(n)) for n in "rtg")
    assert r is not None and r.activity is not None
    assert (r.activity.source, r.activity.busy, r.activity.exact) == ("launch", True, True)
    assert r.activity.last_task == (NOW - 2, NOW - 1)
    assert t is not None and t.activity is None  # no activity block: not seen exactly
    assert g is not None and g.activity is not None and g.activity.busy  # 2 in flight


@pytest.mark.parametrize("last", [[1.0], ["a", "b"], "x"])
def test_a_malformed_last_task_is_one_clear_error(last: Any) -> None:
    doc = state([seen(container("r"), last=(1, 2))], [])
    raw: dict[str, Any] = {
        "node": doc.node, "seq": 1, "timestamp": NOW, "sources": {}, "gpus": [], "tasks": [],
        "recent": [], "containers": [seen(container("r"), last=(1, 2))],
    }  # fmt: skip
    raw["containers"][0]["activity"]["last_task"] = last
    with pytest.raises(StateError, match="activity"):
        parse_state(raw)


# --- best-effort on edges -------------------------------------------------------------------


def test_real_time_busy_on_an_edge_freezes_best_effort_without_a_duty_cycle() -> None:
    d = run(beside(rt_busy=True))
    assert acts(d) == [(PAUSE, "t")] and d.steps[0].reason == "best_effort"
    assert d.duty_cycles == {} and d.realtime_devices == frozenset()  # no NVML law here


def test_a_frozen_best_effort_stays_frozen_while_real_time_is_busy() -> None:
    recent = Recent(duty_cycles={GPU0: DutyCycle(0.9, 1, NOW)})
    d = run(beside(rt_busy=True), ours("t", at=NOW - 0.5), recent)
    assert acts(d) == []  # a duty cycle's run part thaws nothing while the edge says busy
    assert d.next_due == pytest.approx(NOW - 0.5 + 0.9)  # the floor's run part falls due


@pytest.mark.parametrize(("frozen_for", "thawed"), [(0.5, False), (0.89, False), (0.9, True)])
def test_busy_real_time_leaves_best_effort_its_floor_of_every_period(
    frozen_for: float, thawed: bool
) -> None:
    # frozen through (1 - floor) of a period (0.9 s of 1 s): the floor's run part is due
    d = run(beside(rt_busy=True), ours("t", at=NOW - frozen_for))
    assert acts(d) == ([(UNPAUSE, "t")] if thawed else [])
    if thawed:
        assert d.steps[0].reason == "duty_cycle"  # an admission: it runs its floor's share


@pytest.mark.parametrize(
    ("runs", "due"),
    [
        ((), NOW - 0.1),  # nothing known run: the floor's run part after 0.9 s, as each period
        (((NOW - 5.0, NOW - 4.5),), NOW - 0.1),  # ran 0.5 s of the last 10 s: under 1 s
        (((NOW - 12.0, NOW - 1.0),), NOW - 1.0 - 1.0 + 10.0),  # ran 11 s: due as 1 s is left
        (((NOW - 9.5, NOW - 9.0), (NOW - 3.0, NOW - 1.0)), NOW - 3.0 + 1.0 + 10.0),
        (((NOW - 9.5, NOW - 9.0), (NOW - 8.0, NOW - 7.4)), NOW - 9.5 + 0.1 + 10.0),
    ],
)
def test_on_edges_the_floor_is_held_over_its_window_not_each_period(
    runs: tuple[tuple[float, float], ...], due: float
) -> None:
    # frozen at NOW - 1 (ours): the floor's run part falls due once it has been frozen 0.9 s
    # and has run under 10% of the last 10 s (ten periods), so a trainer that ran its share
    # before is not thawed into a long real-time request
    runs_of = {cid("t"): runs} if runs else {}
    later = due > NOW
    d = run(beside(rt_busy=True), ours("t", at=NOW - 1.0), Recent(runs=runs_of))
    assert acts(d) == ([] if later else [(UNPAUSE, "t")])
    if later:
        assert d.next_due == pytest.approx(due)
    else:
        assert d.steps[0].reason == "duty_cycle"
    assert floor_due_at(runs, NOW - 1.0, LAW) == pytest.approx(due)


def test_a_floor_window_of_one_period_thaws_as_each_period_did() -> None:
    law = RateLaw(period_s=1.0, floor=0.1, initial=0.3, floor_window_s=1.0)
    ran_long = ((NOW - 30.0, NOW - 1.0),)
    assert floor_due_at(ran_long, NOW - 1.0, law) == pytest.approx(NOW - 0.1)
    assert floor_due_at(ran_long, NOW - 1.0, RateLaw(floor=0.0, initial=0.3)) is None
    with pytest.raises(ValueError, match="window"):
        RateLaw(period_s=2.0, floor_window_s=1.0)


@pytest.mark.parametrize(("admitted_ago", "frozen"), [(0.05, False), (0.1, True), (5.0, True)])
def test_the_floors_run_part_lasts_the_floors_share_of_a_period(
    admitted_ago: float, frozen: bool
) -> None:
    d = run(beside(rt_busy=True), Ledger(admitted={cid("t"): NOW - admitted_ago}))
    assert acts(d) == ([(PAUSE, "t")] if frozen else [])
    if not frozen:
        assert d.next_due == pytest.approx(NOW - admitted_ago + 0.1)


def test_without_a_floor_busy_real_time_keeps_best_effort_frozen() -> None:
    config = PolicyConfig(rate=RateLaw(period_s=1.0, floor=0.0, initial=0.3))
    st = beside(rt_busy=True)
    d = decide(st, Trigger("fast", NOW), config, ours("t", at=NOW - 30), None)
    assert acts(d) == []


@pytest.mark.parametrize(("idle_for", "thawed"), [(0.0, False), (0.05, False), (0.5, True)])
def test_real_time_idle_thaws_once_the_gap_is_worth_a_thaw(idle_for: float, thawed: bool) -> None:
    st = beside(rt_busy=False, last=(NOW - idle_for - 0.1, NOW - idle_for))
    recent = Recent(freeze_s=0.002)
    d = run(st, ours("t"), recent)
    wait = thaw_after_s(st.container(cid("t")), 0.002)
    assert wait == pytest.approx(0.004 + NVML_SAMPLE_S)  # no exact kernel length: one sample
    if thawed:
        assert acts(d) == [(UNPAUSE, "t")] and d.steps[0].reason == "realtime_idle"
    else:
        assert acts(d) == [] and d.next_due == pytest.approx(NOW - idle_for + wait)


def test_the_wait_before_a_thaw_follows_the_measured_freeze_and_the_kernel_in_flight() -> None:
    trainer = parse_state(
        {"node": "n", "seq": 1, "timestamp": NOW, "sources": {}, "gpus": [], "tasks": [],
         "recent": [], "containers": [seen(container("t", klass=BE), last=(NOW - 1.04, NOW - 1))]}
    ).container(cid("t"))  # fmt: skip
    assert thaw_after_s(trainer, 0.001) == pytest.approx(0.002 + 0.04)  # its 40 ms step
    assert thaw_after_s(trainer, 0.01) == pytest.approx(0.02 + 0.04)  # slower freezes: later
    st = beside(rt_busy=False, last=(NOW - 0.3, NOW - 0.2))
    assert acts(run(st, ours("t"), Recent(freeze_s=0.001))) == [(UNPAUSE, "t")]
    d = run(st, ours("t"), Recent(freeze_s=0.05))  # 0.2 s idle is not yet 0.1 + 1/6 s
    assert acts(d) == [] and d.next_due == pytest.approx(NOW - 0.2 + 0.1 + NVML_SAMPLE_S)


def with_slack(deadline: float | None, longest: float | None, idle_for: float) -> Any:
    """``beside``'s pair, the server idle for ``idle_for`` after a 0.1 s request, its
    deadline and longest learnt run as given; the trainer's last step 40 ms."""
    server = container("r", deadline=deadline, klass="real-time")
    r = seen(server, last=(NOW - idle_for - 0.1, NOW - idle_for))
    r["longest_run_s"] = longest
    t = seen(container("t", klass=BE), last=(NOW - 1.04, NOW - 1))
    ts = [task("r", "draining", 1, sm=0.4), task("t", "computing", 2, sm=0.6)]
    return state([r, t], ts, util=1.0)


@pytest.mark.parametrize(
    ("deadline", "longest", "waits"),
    [
        (0.5, 0.3, False),  # 200 ms of slack covers twice the trainer's 40 ms in flight
        (0.5, 0.45, True),  # 50 ms does not: a gap shorter than 40 ms stays the server's
        (0.5, None, True),  # no run learnt yet: nothing known of its slack
        (None, 0.1, True),  # no deadline: no slack to spend
    ],
)
def test_real_time_slack_that_covers_the_work_in_flight_thaws_the_gap_at_once(
    deadline: float | None, longest: float | None, waits: bool
) -> None:
    st = with_slack(deadline, longest, idle_for=0.01)  # 10 ms into the gap
    d = run(st, ours("t"), Recent(freeze_s=0.002))
    if waits:
        assert acts(d) == [] and d.next_due == pytest.approx(NOW - 0.01 + 0.004 + 0.04)
    else:
        assert acts(d) == [(UNPAUSE, "t")] and d.steps[0].reason == "realtime_idle"


def test_the_least_slack_on_the_device_decides() -> None:
    st = with_slack(0.5, 0.3, idle_for=0.01)
    # a second real-time container on the same GPU, with 10 ms of slack
    tight = seen(container("q", deadline=0.2), last=(NOW - 0.2, NOW - 0.1))
    tight["longest_run_s"] = 0.19
    r = seen(container("r", deadline=0.5), last=(NOW - 0.11, NOW - 0.01))
    r["longest_run_s"] = 0.3
    t = seen(container("t", klass=BE), last=(NOW - 1.04, NOW - 1))
    ts = [task("r", "draining", 1, sm=0.4), task("q", "draining", 3, sm=0.1, pid=7)]
    ts.append(task("t", "computing", 2, sm=0.5))
    both = state([r, tight, t], ts, util=1.0)
    assert acts(run(st, ours("t"), Recent(freeze_s=0.002))) == [(UNPAUSE, "t")]
    assert acts(run(both, ours("t"), Recent(freeze_s=0.002))) == []


def test_a_best_effort_container_not_ours_is_left_running_when_real_time_is_idle() -> None:
    assert acts(run(beside(rt_busy=False, last=(NOW - 0.02, NOW - 0.01)))) == []


def test_an_unmanaged_best_effort_beside_busy_real_time_is_a_skip() -> None:
    st = beside(rt_busy=True)
    cs = [seen(container("r", deadline=2.0), busy=True), container("t", klass=BE, managed=False)]
    st = state(cs, [task("r", "computing", 1), task("t", "computing", 2)], util=1.0)
    d = run(st)
    assert acts(d) == [] and "unmanaged" in reasons(d)


def test_a_gauge_source_is_exact_too() -> None:
    cs = [seen(container("r", deadline=2.0), source="gauge", inflight=1), container("t", klass=BE)]
    st = state(cs, [task("r", "computing", 1), task("t", "computing", 2)], util=1.0)
    assert acts(run(st)) == [(PAUSE, "t")]
    cs[0] = seen(container("r", deadline=2.0), source="gauge", inflight=0)
    st = state(cs, [task("r", "computing", 1), task("t", "computing", 2)], util=1.0)
    d = run(st, ours("t"))
    assert acts(d) == [(UNPAUSE, "t")]  # nothing in flight, no task seen ending: idle


# --- the devices of a real-time container with no task yet ----------------------------------


def first_request(devices: list[tuple[int, int | None]] | None, gpus: list[str]) -> Any:
    """Server r, seen by the probe and busy on its first request, has no task running or
    recent (its start-up over; or its last tasks aged out); trainers t on GPU 1 and u on
    GPU 0. ``devices``: where the exporter shows r's processes (None: an older exporter)."""
    r = seen(container("r", deadline=2.0), busy=True)
    r["gpus"] = gpus
    if devices is not None:
        r["devices"] = [{"gpu": g, "mig_index": m} for g, m in devices]
    cs = [r, container("t", klass=BE), container("u", klass=BE)]
    ts = [task("t", "computing", 1, gpu=1, sm=0.6), task("u", "computing", 2, gpu=0, sm=0.6)]
    return state(cs, ts, util=1.0, gpus=2)


def test_a_first_request_freezes_best_effort_on_the_devices_its_processes_are_on() -> None:
    st = first_request([(1, None)], ["all"])
    assert st.container(cid("r")).devices == ((1, None),)  # type: ignore[union-attr]
    assert edges_of(st, devices_of(st)).busy == {(1, None)}
    d = run(st)
    assert acts(d) == [(PAUSE, "t")] and d.steps[0].reason == "best_effort"


@pytest.mark.parametrize(("gpus", "frozen"), [(["1"], ["t"]), (["all"], ["t", "u"]), ([], [])])
def test_a_first_request_with_no_process_seen_yet_freezes_on_the_gpus_it_was_given(
    gpus: list[str], frozen: list[str]
) -> None:
    # an exporter without ``devices``, or a process NVML does not list yet
    for devices in (None, []):
        d = run(first_request(devices, gpus))
        assert sorted(acts(d)) == [(PAUSE, n) for n in frozen]


def test_the_gpus_given_are_a_fallback_not_added_to_what_is_seen() -> None:
    st = first_request([(1, None)], ["all"])
    assert devices_of(st)[cid("r")] == {(1, None)}
    cs = [seen(container("r", deadline=2.0), busy=True)]  # given GPU 0, a task on GPU 1
    st = state(cs, [task("r", "computing", 1, gpu=1)], gpus=2)
    assert devices_of(st)[cid("r")] == {(1, None)}


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        (["all"], {(0, 0), (0, 1), (1, None)}),
        (["0"], {(0, 0), (0, 1)}),  # a MIG-partitioned GPU: every MIG device of it
        (["0:1"], {(0, 1)}),
        (["1:0", "7", "x"], set()),
        (["MIG-0-1", "GPU-1"], {(0, 1), (1, None)}),
        ([], set()),
    ],
)
def test_the_gpus_a_container_was_given_name_whole_gpus_mig_devices_or_uuids(
    gpus: list[str], expected: set[DeviceKey]
) -> None:
    devices = (Gpu(0, "MIG-0-0", 1, 0, None, 0), Gpu(0, "MIG-0-1", 1, 0, None, 1))
    devices += (Gpu(1, "GPU-1", 1, 0, 0.0),)
    assert declared_devices(gpus, devices) == expected


def test_devices_are_optional_and_checked_where_given() -> None:
    raw: dict[str, Any] = {
        "node": "host-a", "seq": 1, "timestamp": NOW, "sources": {}, "gpus": [], "tasks": [],
        "recent": [], "containers": [container("r")],
    }  # fmt: skip
    assert parse_state(raw).containers[0].devices == ()  # an exporter before the field
    raw["containers"][0]["devices"] = [{"gpu": 0, "mig_index": 2}, {"gpu": 1}]
    assert parse_state(raw).containers[0].devices == ((0, 2), (1, None))
    raw["containers"][0]["devices"] = [{"mig_index": 2}]
    with pytest.raises(StateError, match=r"containers\[0\].devices\[0\].gpu is missing"):
        parse_state(raw)


# --- a device with exact and NVML-only real-time work ---------------------------------------


def mixed(exact_busy: bool) -> Any:
    cs = [seen(container("r", deadline=2.0), busy=exact_busy, last=(NOW - 3, NOW - 2))]
    cs += [container("s", deadline=2.0), container("t", klass=BE)]
    ts = [task("r", "computing" if exact_busy else "draining", 1, sm=0.3)]
    ts += [task("s", "computing", 2, sm=0.3, pid=8), task("t", "computing", 3, sm=0.4, pid=9)]
    return state(cs, ts, util=1.0)


def test_mixed_device_nvml_real_time_alone_active_runs_the_duty_cycle() -> None:
    d = run(mixed(exact_busy=False), ours("t"), Recent(duty_cycles={GPU0: DutyCycle(0.3, 1, NOW)}))
    assert acts(d) == [(UNPAUSE, "t")] and d.steps[0].reason == "duty_cycle"
    assert d.realtime_devices == frozenset({GPU0})  # the NVML law, for the NVML-only server


def test_mixed_device_exact_real_time_busy_freezes_whatever_the_cycle_says() -> None:
    d = run(mixed(exact_busy=True), None, Recent(duty_cycles={GPU0: DutyCycle(0.3, 1, NOW)}))
    steps = {s.container: s.reason for s in d.steps}
    assert steps["t"] == "best_effort"  # (the NVML-only server waits its turn: FIFO)


# --- real-time tasks on their exact boundaries ----------------------------------------------


def repeaters(second_phase: str, second_busy: bool) -> Any:
    """rt-1 runs its kernel (the probe sees it busy; NVML's last sample still says input);
    rt-2's next task shows in NVML's sample as ``second_phase``."""
    cs = [seen(container("a", deadline=9.0), busy=True)]
    cs.append(seen(container("b", deadline=9.0), busy=second_busy, last=(NOW - 2, NOW - 0.5)))
    ts = [task("a", "input", 2, deadline=9.0), task("b", second_phase, 1, deadline=9.0, age=3)]
    return state(cs, ts, util=1.0)


def test_a_kernel_nvml_still_shows_after_the_probe_saw_it_end_is_draining() -> None:
    # NVML's last sample shows rt-2 computing; the probe says its kernel ended and nothing
    # was launched since: no kernel runs, so rt-1 is not preempted and nothing is skipped
    # as "kernel_running"
    d = run(repeaters("computing", second_busy=False))
    assert acts(d) == [] and reasons(d) == []


def test_without_the_probe_the_merged_period_keeps_its_place() -> None:
    cs = [container("a", deadline=9.0), container("b", deadline=9.0)]
    ts = [task("a", "computing", 2, deadline=9.0), task("b", "input", 1, deadline=9.0, age=3)]
    steps = {s.container: s.reason for s in run(state(cs, ts, util=1.0)).steps}
    assert steps["a"] == "preempt"  # today's law: b is first in the queue


def test_an_exporter_without_in_flight_reads_busy_for_it() -> None:
    c = seen(container("a"), busy=True)
    del c["activity"]["in_flight"]
    parsed = state([c], []).container(cid("a"))
    assert parsed is not None and parsed.activity is not None and parsed.activity.in_flight


def quantum(in_flight: bool, seen_by_probe: bool = True) -> Decision:
    """rt-1 was admitted 0.1 s ago and NVML's last sample shows it computing; rt-2, ahead
    of it in the queue, waits frozen."""
    a, b = container("a", deadline=9.0), container("b", deadline=9.0, paused=True)
    if seen_by_probe:
        a = seen(a, busy=True, in_flight=in_flight)
    ts = [task("a", "computing", 2, deadline=9.0)]
    ts.append(task("b", "input", 1, deadline=9.0, paused=True))
    ledger = Ledger(paused={cid("b"): NOW - 1}, admitted={cid("a"): NOW - 0.1})
    return run(state([a, b], ts), ledger)


def test_a_holder_with_no_kernel_in_flight_has_no_run_quantum() -> None:
    d = quantum(in_flight=False)  # its kernel was waited for: no kernel holds the device
    assert acts(d) == [(UNPAUSE, "b")] and "run_quantum" not in reasons(d)


@pytest.mark.parametrize("seen_by_probe", [True, False])
def test_a_holder_with_a_kernel_in_flight_or_unseen_keeps_its_quantum(seen_by_probe: bool) -> None:
    d = quantum(in_flight=True, seen_by_probe=seen_by_probe)
    assert acts(d) == [] and "run_quantum" in reasons(d)


def test_a_busy_period_between_kernels_is_draining_not_computing() -> None:
    # the probe's busy period runs on through the copies after a kernel (its output, the
    # next input): no kernel in flight, so NVML's last "computing" is stale
    c = seen(container("a", deadline=9.0), busy=True, in_flight=False)
    st = state([c], [task("a", "computing", 1, deadline=9.0)])
    assert edge_phase(st.tasks[0], st.container(cid("a"))).phase == "draining"
    c = seen(container("a", deadline=9.0), busy=True, in_flight=True)
    st = state([c], [task("a", "input", 1, deadline=9.0)])
    assert edge_phase(st.tasks[0], st.container(cid("a"))).phase == "computing"


def between_kernels(timed_by: str | None) -> Any:
    """Light task a, timed by the probe (``timed_by``), is between two of its kernels (host
    work, no kernel in flight, its busy period over); b, of unknown demand, waits frozen."""
    a = seen(container("a"), busy=False, in_flight=False, last=(NOW - 0.05, NOW - 0.03))
    b = container("b", paused=True)
    ts = [task("a", "computing", 1, sm=0.0), task("b", "input", 2, paused=True)]
    if timed_by is not None:
        ts[0]["timed_by"] = timed_by
    return state([a, b], ts)


def test_a_task_the_probe_times_holds_the_device_between_its_kernels() -> None:
    # the exporter's task goes on through its host work: admission runs tasks of unknown
    # demand one at a time, so b waits (it would overlap a's next kernel)
    st = between_kernels("launch")
    assert st.tasks[0].timed_by == "launch"
    assert edge_phase(st.tasks[0], st.container(cid("a"))).phase == "computing"
    assert acts(run(st, Ledger(paused={cid("b"): NOW - 1}))) == []


@pytest.mark.parametrize("timed_by", ["nvml", None])
def test_a_task_the_samples_time_with_no_kernel_in_flight_is_draining(
    timed_by: str | None,
) -> None:
    # NVML's last sample says computing, the probe says no kernel: its kernels are done and
    # the next waiter's input overlaps its output (an exporter that does not say: nvml)
    st = between_kernels(timed_by)
    assert st.tasks[0].timed_by == "nvml"
    assert edge_phase(st.tasks[0], st.container(cid("a"))).phase == "draining"
    assert acts(run(st, Ledger(paused={cid("b"): NOW - 1}))) == [(UNPAUSE, "b")]


def test_a_trainers_steps_learnt_unfrozen_are_its_work_in_flight() -> None:
    # back-to-back steps make one long busy period (its last task: 0.5 s of steps); the
    # steps it ran unfrozen say 40 ms are in flight when it is frozen
    st = with_slack(0.5, 0.45, idle_for=0.05)  # 50 ms of slack, 50 ms into the gap
    t = st.container(cid("t"))
    assert thaw_after_s(t, 0.002, 0.05, step_s=0.04) == pytest.approx(0.004 + 0.04)
    assert thaw_after_s(t, 0.002, 0.05, step_s=1.0) == pytest.approx(0.004 + NVML_SAMPLE_S)
    assert thaw_after_s(t, 0.002, 0.2, step_s=0.04) == pytest.approx(0.004)  # slack covers it
    long_period = replace_last_task(st, "t", (NOW - 1.5, NOW - 1.0))
    assert acts(run(long_period, ours("t"), Recent(freeze_s=0.002))) == []  # 1/6 s assumed
    learnt = Recent(freeze_s=0.002, steps={cid("t"): 0.04})
    d = run(long_period, ours("t"), learnt)
    assert acts(d) == [(UNPAUSE, "t")] and d.steps[0].reason == "realtime_idle"


def replace_last_task(st: Any, name: str, last: tuple[float, float]) -> Any:
    from dataclasses import replace

    containers = []
    for c in st.containers:
        if c.id == cid(name):
            c = replace(c, activity=replace(c.activity, last_task=last))
        containers.append(c)
    return replace(st, containers=tuple(containers))


@pytest.mark.parametrize("step", [[1.0], ["a", "b"], 3])
def test_a_malformed_last_step_is_one_clear_error(step: Any) -> None:
    raw: dict[str, Any] = {
        "node": "n", "seq": 1, "timestamp": NOW, "sources": {}, "gpus": [], "tasks": [],
        "recent": [], "containers": [seen(container("t", klass=BE))],
    }  # fmt: skip
    raw["containers"][0]["activity"]["last_step"] = [NOW - 1.04, NOW - 1]
    parsed = parse_state(raw).container(cid("t"))
    assert parsed is not None and parsed.activity is not None
    assert parsed.activity.last_step == (NOW - 1.04, NOW - 1)
    raw["containers"][0]["activity"]["last_step"] = step
    with pytest.raises(StateError, match="last_step"):
        parse_state(raw)
