"""Table tests of the admission policy (actuator.admission.policy.decide): one case per branch."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuguard.actuator.admission.policy.decide import decide
from gpuguard.actuator.admission.policy.order import queue_order
from gpuguard.actuator.decision import (
    PAUSE,
    UNPAUSE,
    Decision,
    Ledger,
    PolicyConfig,
    Recent,
    Trigger,
)
from gpuguard.actuator.state import EndedTask
from tests.unit.policy_support import GIB, NOW, acts, cid, container, ours, reasons, state, task


def run(
    st: Any,
    ledger: Ledger | None = None,
    gpu: int | None = None,
    node: str | None = None,
    now: float = NOW,
    **config: Any,
) -> Decision:
    return decide(st, Trigger("fast", now, node=node, gpu=gpu), policy(**config), ledger)


def policy(**config: Any) -> PolicyConfig:
    """The knobs of the shipping policy (best-effort's duty cycles have their own table,
    test_actuator_policy_rate.py, and its edges theirs, test_actuator_policy_edges.py)."""
    return PolicyConfig(**config)


# --- occupancy and newcomers -----------------------------------------------------------


def test_lone_task_runs_untouched() -> None:
    d = run(state([container("a")], [task("a", "starting", 1)]))
    assert acts(d) == []


def test_tasks_starting_together_keep_the_first_in_fifo_order() -> None:
    cs = [container(n) for n in "abcd"]
    ts = [task(n, "starting", i + 1) for i, n in enumerate("abcd")]
    assert acts(run(state(cs, ts))) == [(PAUSE, "b"), (PAUSE, "c"), (PAUSE, "d")]


def test_tasks_starting_together_keep_the_earliest_deadline_under_edf() -> None:
    cs = [container(n) for n in "abcd"]
    ts = [
        task("a", "starting", 1, deadline=None),
        task("b", "starting", 2, deadline=50),
        task("c", "starting", 3, deadline=5),
        task("d", "starting", 4, deadline=60),
    ]
    assert acts(run(state(cs, ts), order="edf")) == [(PAUSE, "b"), (PAUSE, "d"), (PAUSE, "a")]


def test_newcomer_is_paused_while_a_kernel_runs() -> None:
    cs = [container("a"), container("b")]
    ts = [task("a", "computing", 1), task("b", "input", 2)]
    assert acts(run(state(cs, ts, util=1.0))) == [(PAUSE, "b")]


def test_without_preemption_a_newcomer_whose_kernel_already_runs_is_left_alone() -> None:
    cs = [container("a"), container("b")]
    ts = [task("a", "computing", 1), task("b", "computing", 2)]
    d = run(state(cs, ts, util=1.0), preempt=False)
    assert acts(d) == []
    assert "kernel_running" in reasons(d)


# --- preemption ------------------------------------------------------------------------


def test_a_later_task_first_seen_computing_is_preempted() -> None:
    # a server's request (or a repeater's next run) is first seen computing: its memory
    # stays cached, so there is no input phase to catch
    cs = [container("a"), container("b")]
    ts = [task("a", "computing", 1), task("b", "computing", 2)]
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [(PAUSE, "b")] and d.steps[0].reason == "preempt"
    assert "kernel_running" not in reasons(d)


def test_a_holder_that_started_later_is_frozen_and_the_waiter_admitted() -> None:
    # b waited (paused by us) since before a's new task began: b has precedence
    cs = [container("a"), container("b", paused=True)]
    ts = [task("a", "computing", 2), task("b", "input", 1, paused=True)]
    d = run(state(cs, ts, util=1.0), ours("b"))
    assert acts(d) == [(PAUSE, "a")] and d.steps[0].reason == "preempt"
    # what a launched already drains frozen; b goes once it has (one after another)
    ts[0] = task("a", "computing", 2, paused=True)
    assert acts(run(state(cs, ts, util=1.0), ours("a", "b"))) == []
    ts[0] = task("a", "draining", 2, paused=True)
    d = run(state(cs, ts, util=0.0), ours("a", "b"))
    assert acts(d) == [(UNPAUSE, "b")] and d.steps[0].reason == "admit"


def test_a_holder_admitted_within_its_quantum_is_not_preempted() -> None:
    cs = [container("a"), container("b", paused=True)]
    ts = [task("a", "computing", 2), task("b", "input", 1, paused=True)]
    ledger = Ledger(paused={cid("b"): NOW - 3}, admitted={cid("a"): NOW - 0.2})
    d = run(state(cs, ts, util=1.0), ledger, preempt_quantum_s=0.5)
    assert acts(d) == [] and "run_quantum" in reasons(d)
    assert d.next_due == pytest.approx(NOW + 0.3)  # decided again when the quantum ends
    ledger = Ledger(paused={cid("b"): NOW - 3}, admitted={cid("a"): NOW - 0.6})
    d = run(state(cs, ts, util=1.0), ledger, preempt_quantum_s=0.5)
    assert acts(d) == [(PAUSE, "a")]


def test_edf_preempts_the_looser_holder_for_a_tighter_newcomer() -> None:
    cs = [container("a", deadline=60), container("b", deadline=2)]
    ts = [task("a", "computing", 1, deadline=60), task("b", "computing", 2, deadline=2)]
    assert acts(run(state(cs, ts, util=1.0), order="edf")) == [(PAUSE, "a")]
    assert acts(run(state(cs, ts, util=1.0), order="fifo")) == [(PAUSE, "b")]


def test_real_time_preempts_normal_work_whatever_the_order() -> None:
    cs = [container("n"), container("r", deadline=5)]
    ts = [task("n", "computing", 1), task("r", "computing", 2, deadline=5)]
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [(PAUSE, "n")] and d.steps[0].reason == "preempt"


def test_no_preemption_that_only_trades_one_miss_for_another() -> None:
    # b's deadline has passed already: it misses whatever happens; a, left alone, meets its
    # own, and preempted it would not (b's run time is 4 s, a has 1 s of slack)
    cs = [container("a", deadline=10), container("b", deadline=1)]
    cs[0]["typical_run_s"] = 3.0
    cs[1]["typical_run_s"] = 4.0
    ts = [task("a", "computing", 2, deadline=10, age=2.0), task("b", "input", 1, deadline=1)]
    for t in ts:
        t["mode"] = "process"  # exact boundaries: their deadlines are the work's own
    ts[0]["absolute_deadline"] = NOW + 2.0
    ts[1]["absolute_deadline"] = NOW - 0.5
    d = run(state(cs, ts, util=1.0), order="edf")
    # a keeps the device; b, real-time and out of slack, is not frozen either (it was: a
    # freeze that outlasted its deadline, issue 24)
    assert acts(d) == [] and "preempt_futile" in reasons(d)
    # with the slack to let b run first, a is preempted
    ts[0]["absolute_deadline"] = NOW + 8.0
    d = run(state(cs, ts, util=1.0), order="edf")
    assert acts(d) == [(PAUSE, "a")] and d.steps[0].reason == "preempt"


def with_recent(st: Any, name: str, ended_ago: float) -> Any:
    """``st`` with a finished task of ``name`` that ended ``ended_ago`` seconds ago."""
    done = EndedTask(cid(name), NOW - ended_ago - 2.0, NOW - ended_ago)
    return replace(st, recent=(*st.recent, done))


STRAIGHT_ON_A = Recent(straight_on=frozenset({cid("a")}))


def test_a_draining_holder_that_goes_straight_on_yields_to_the_waiter() -> None:
    # a keeps its memory and launches its next kernel at once (learnt): frozen now, that
    # kernel cannot land beside b's
    cs = [container("a"), container("b", paused=True)]
    ts = [task("a", "draining", 1, age=1.0), task("b", "input", 2, paused=True)]
    d = decide(state(cs, ts), Trigger("fast", NOW), PolicyConfig(), ours("b"), STRAIGHT_ON_A)
    assert sorted(acts(d)) == [(PAUSE, "a"), (UNPAUSE, "b")]
    assert {a.reason for a in d.steps} == {"yield", "admit"}
    # a one-shot, or a program whose next input shows, drains in peace
    assert acts(run(state(cs, ts), ours("b"))) == [(UNPAUSE, "b")]
    # as does one whose next task fits beside the waiter's
    cs = [container("a", demand=0.3), container("b", paused=True, demand=0.3)]
    d = decide(state(cs, ts), Trigger("fast", NOW), PolicyConfig(), ours("b"), STRAIGHT_ON_A)
    assert acts(d) == [(UNPAUSE, "b")]


def test_a_container_between_two_tasks_yields_too() -> None:
    # a's last task ended 0.3 s ago; it goes straight on: its next is coming
    cs = [container("a"), container("b", paused=True)]
    ts = [task("b", "input", 2, paused=True)]
    st = with_recent(state(cs, ts), "a", ended_ago=0.3)
    st = replace(st, recent=tuple(replace(r, gpu=0) for r in st.recent))
    d = decide(st, Trigger("fast", NOW), PolicyConfig(), ours("b"), STRAIGHT_ON_A)
    assert sorted(acts(d)) == [(PAUSE, "a"), (UNPAUSE, "b")]
    assert acts(run(st, ours("b"))) == [(UNPAUSE, "b")]  # not known to go straight on
    # it is thawed in its turn: once nothing else computes on its GPU
    yielded = Ledger(paused={cid("a"): NOW - 1}, yielded={cid("a"): 0})
    ts = [task("b", "computing", 2)]
    assert acts(run(state(cs, ts, util=1.0), yielded)) == []
    ts = [task("b", "draining", 2)]
    d = run(state(cs, ts), yielded)
    assert acts(d) == [(UNPAUSE, "a")] and d.steps[0].reason == "admit"


def test_a_yielded_container_waits_as_its_next_task_would() -> None:
    # a yielded (paused as it drained) 0.3 s ago; b, admitted then, computes: b keeps the
    # device although a's draining task began first; a goes when b drains
    cs = [container("a", paused=True), container("b")]
    ts = [task("a", "draining", 1, paused=True), task("b", "computing", 2)]
    ledger = Ledger(
        paused={cid("a"): NOW - 0.3}, admitted={cid("b"): NOW - 3}, yielded={cid("a"): 0}
    )
    assert acts(run(state(cs, ts, util=1.0), ledger)) == []
    ts[1] = task("b", "draining", 2)
    both = Recent(straight_on=frozenset({cid("a"), cid("b")}))
    d = decide(state(cs, ts), Trigger("fast", NOW), PolicyConfig(), ledger, both)
    assert acts(d) == [(PAUSE, "b"), (UNPAUSE, "a")]  # b yields in turn: they alternate
    assert [a.reason for a in d.steps] == ["yield", "admit"]


def test_under_edf_a_tight_repeater_does_not_yield_to_a_looser_waiter() -> None:
    cs = [container("a", deadline=0.5), container("b", deadline=30, paused=True)]
    ts = [
        task("a", "draining", 1, age=1.0, deadline=0.5),
        task("b", "input", 2, paused=True, deadline=30),
    ]
    d = decide(state(cs, ts), Trigger("fast", NOW), PolicyConfig(order="edf"), ours("b"),
               STRAIGHT_ON_A)  # fmt: skip
    assert acts(d) == [(UNPAUSE, "b")]


def test_a_busy_server_past_its_first_deadline_keeps_its_edf_rank() -> None:
    # two busy servers: the tight one's busy period began 3 s ago (its first request's
    # deadline long past), the loose one's 1 s ago; the requests waiting in the tight one
    # are due within 1 s of now, the loose one's within 30 s: the tight one goes first,
    # and being late does not make preempting for it futile (bursts hold many requests)
    cs = [container("t", deadline=1), container("l", deadline=30)]
    cs[0]["typical_run_s"] = cs[1]["typical_run_s"] = 0.3
    ts = [
        task("t", "computing", 1, deadline=1, age=3.0),
        task("l", "computing", 2, deadline=30, age=1.0),
    ]
    d = run(state(cs, ts, util=1.0), order="edf")
    assert acts(d) == [(PAUSE, "l")] and "preempt_futile" not in reasons(d)
    # before its first deadline a burst ranks by it: l's is due in 0.5 s, t's in 1.8 s
    cs[0]["deadline_s"] = 2.0
    ts = [
        task("t", "computing", 1, deadline=2, age=0.2),
        task("l", "computing", 2, deadline=5, age=4.5),
    ]
    assert acts(run(state(cs, ts, util=1.0), order="edf")) == [(PAUSE, "t")]
    # a busy period that merged several requests ranks by a request arriving now
    ts[1]["boundary"] = "merged"
    assert acts(run(state(cs, ts, util=1.0), order="edf")) == [(PAUSE, "l")]
    # but the busy period of a server (it merged, and l was seen serving: new tasks computing
    # right after a drain) is not ranked at all (it was, and l was frozen for t: issue 24's
    # two servers, one worse than sharing); without an SLO signal it shares
    both = Recent(serving=frozenset({cid("t"), cid("l")}))
    d = decide(state(cs, ts, util=1.0), Trigger("fast", NOW), PolicyConfig(order="edf"),
               None, both)  # fmt: skip
    assert acts(d) == []


def test_under_edf_a_tight_server_does_not_yield_to_a_late_loose_one() -> None:
    # l's busy period began 10 s ago (its first deadline long past): what waits in it is
    # due by now + 30 s, after what t's next request would be (now + 1 s)
    cs = [container("t", deadline=1), container("l", deadline=30, paused=True)]
    ts = [
        task("t", "draining", 1, age=0.5, deadline=1),
        task("l", "computing", 2, age=40.0, deadline=30, paused=True),
    ]
    d = decide(state(cs, ts), Trigger("fast", NOW), PolicyConfig(order="edf"),
               ours("l"), Recent(straight_on=frozenset({cid("t"), cid("l")})))  # fmt: skip
    assert (PAUSE, "t") not in acts(d)


def test_unmanaged_holders_are_never_preempted() -> None:
    cs = [container("a", managed=False), container("b")]
    ts = [task("a", "computing", 2), task("b", "input", 1)]
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [(PAUSE, "b")]


def test_draining_task_frees_the_gpu_and_the_first_waiting_task_is_admitted() -> None:
    cs = [container("a"), container("b", paused=True), container("c", paused=True)]
    ts = [
        task("a", "draining", 1),
        task("b", "input", 2, paused=True),
        task("c", "input", 3, paused=True),
    ]
    assert acts(run(state(cs, ts), ours("b", "c"))) == [(UNPAUSE, "b")]


def test_admission_order_is_edf_with_deadline_less_tasks_last() -> None:
    cs = [container(n, paused=True) for n in "bcd"]
    ts = [
        task("b", "input", 2, paused=True),
        task("c", "input", 3, deadline=80, paused=True),
        task("d", "input", 4, deadline=10, paused=True),
    ]
    st = state(cs, ts)
    assert acts(run(st, ours("b", "c", "d"), order="edf")) == [(UNPAUSE, "d")]
    assert acts(run(st, ours("b", "c", "d"), order="fifo")) == [(UNPAUSE, "b")]


def test_newcomer_on_a_free_gpu_does_not_jump_the_queue() -> None:
    # a and b wait (paused by us); c arrives just as the GPU frees: a goes first, c waits.
    cs = [container("a", paused=True), container("b", paused=True), container("c")]
    ts = [task("a", "input", 1, paused=True), task("b", "input", 2, paused=True)]
    ts.append(task("c", "starting", 3))
    assert acts(run(state(cs, ts), ours("a", "b"))) == [(PAUSE, "c"), (UNPAUSE, "a")]


def test_one_admission_per_decision() -> None:
    cs = [container(n, paused=True) for n in "bc"]
    ts = [task("b", "input", 2, paused=True), task("c", "input", 3, paused=True)]
    d = run(state(cs, ts), ours("b", "c"))
    assert acts(d) == [(UNPAUSE, "b")]


def test_container_paused_by_someone_else_is_never_admitted() -> None:
    cs = [container("b", paused=True)]
    ts = [task("b", "input", 2, paused=True)]
    assert acts(run(state(cs, ts))) == []


def test_kernel_of_a_paused_container_still_occupies() -> None:
    cs = [container("a", paused=True), container("b", paused=True)]
    ts = [task("a", "computing", 1, paused=True), task("b", "input", 2, paused=True)]
    assert acts(run(state(cs, ts, util=1.0), ours("b"))) == []


# --- input timeout -----------------------------------------------------------------------


def test_idle_context_past_input_timeout_stops_blocking_the_queue() -> None:
    cs = [container("a"), container("b", paused=True)]
    ts = [task("a", "starting", 1, age=99), task("b", "input", 2, paused=True)]
    d = run(state(cs, ts), ours("b"), input_timeout_s=5.0)
    assert acts(d) == [(UNPAUSE, "b")]  # a has been idle ~99 s: it is neither kept nor paused
    assert "input_timeout" in reasons(d)


def test_input_timeout_counts_from_admission_not_from_task_start() -> None:
    cs = [container("a"), container("b", paused=True)]
    ts = [task("a", "input", 1, age=99), task("b", "input", 2, paused=True)]
    ledger = Ledger(paused={cid("b"): NOW - 50}, admitted={cid("a"): NOW - 1})
    assert acts(run(state(cs, ts), ledger, input_timeout_s=5.0)) == []


# --- who may be paused ---------------------------------------------------------------------


def test_unmanaged_task_occupies_but_is_never_paused() -> None:
    cs = [container("a", managed=False), container("b", managed=False), container("c", paused=True)]
    ts = [task("a", "input", 1), task("b", "input", 2), task("c", "input", 3, paused=True)]
    d = run(state(cs, ts), ours("c"))
    assert acts(d) == []
    assert "unmanaged" in reasons(d)


def test_process_in_no_container_occupies() -> None:
    cs = [container("c", paused=True)]
    ts = [task(None, "computing", 1), task("c", "input", 2, paused=True)]
    assert acts(run(state(cs, ts, util=1.0), ours("c"))) == []


def test_gpuguard_components_are_never_paused() -> None:
    cs = [container("a"), container("e", role="exporter"), container("f", role="actuator")]
    ts = [task("a", "computing", 1), task("e", "input", 2), task("f", "input", 3)]
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == []
    assert reasons(d).count("gpuguard_component") == 2


def test_task_exempted_after_max_pause_is_not_paused_again() -> None:
    cs = [container("a"), container("b")]
    ts = [task("a", "computing", 1), task("b", "input", 2)]
    b_task = ts[1]["task_id"]
    d = run(state(cs, ts, util=1.0), Ledger(exempt_tasks=frozenset({b_task})))
    assert acts(d) == []
    assert "max_pause_exempt" in reasons(d)


def test_admitted_task_stays_the_holder_when_an_older_one_reenters_input() -> None:
    cs = [container("a"), container("b")]
    ts = [task("a", "input", 1), task("b", "input", 2)]
    ledger = Ledger(admitted={cid("b"): NOW - 0.5})
    assert acts(run(state(cs, ts), ledger)) == [(PAUSE, "a")]


def test_stale_docker_view_of_a_just_admitted_container_is_overridden() -> None:
    # We unpaused b 0.2 s ago; the snapshot (older) still shows it paused. The GPU must not
    # look free, or c would be admitted too.
    cs = [container("b", paused=True), container("c", paused=True)]
    ts = [task("b", "input", 2, paused=True), task("c", "input", 3, paused=True)]
    ledger = Ledger(paused={cid("c"): NOW - 5}, admitted={cid("b"): NOW - 0.2})
    assert acts(run(state(cs, ts, timestamp=NOW - 0.1), ledger)) == []


# --- saturation and memory -----------------------------------------------------------------


def test_saturated_gpu_with_an_active_task_is_occupied() -> None:
    cs = [container("a"), container("b", paused=True)]
    ts = [task("a", "input", 1, age=99), task("b", "input", 2, paused=True)]  # a timed out
    assert acts(run(state(cs, ts, util=1.0), ours("b"))) == []
    assert acts(run(state(cs, ts, util=0.5), ours("b"))) == [(UNPAUSE, "b")]


def test_memory_above_threshold_blocks_admission() -> None:
    cs = [container("a"), container("b", paused=True)]
    ts = [task("a", "draining", 1), task("b", "input", 2, paused=True)]
    d = run(state(cs, ts, mem_used=int(23.5 * GIB)), ours("b"))
    assert acts(d) == []
    assert "memory_pressure" in reasons(d)


def test_memory_above_threshold_pauses_the_last_admitted_before_its_kernel() -> None:
    cs = [container("a"), container("b")]
    ts = [task("a", "draining", 1), task("b", "input", 2)]
    ledger = Ledger(admitted={cid("b"): NOW - 0.3})
    d = run(state(cs, ts, mem_used=int(23.5 * GIB)), ledger)
    assert acts(d) == [(PAUSE, "b")]
    assert d.steps[0].reason == "memory_pressure"


def test_memory_rule_leaves_a_last_admitted_task_that_computes() -> None:
    cs = [container("b")]
    ts = [task("b", "computing", 2)]
    ledger = Ledger(admitted={cid("b"): NOW - 3})
    assert acts(run(state(cs, ts, util=1.0, mem_used=int(23.5 * GIB)), ledger)) == []


# --- caps, scope, staleness, clean-up ------------------------------------------------------


def test_cap_limits_containers_touched_per_decision() -> None:
    names = [f"c{i}" for i in range(14)]
    cs = [container(n) for n in names]
    ts = [task(n, "starting", i + 1) for i, n in enumerate(names)]
    d = run(state(cs, ts), max_actions=10)
    assert len(d.steps) == 10
    assert reasons(d).count("cap") == 3  # 13 newcomers, 10 paused, 3 capped


def test_stale_snapshot_is_not_acted_on() -> None:
    cs = [container(n) for n in "ab"]
    ts = [task("a", "starting", 1), task("b", "starting", 2)]
    d = run(state(cs, ts, timestamp=NOW - 30))
    assert acts(d) == [] and reasons(d) == ["stale_state"]


def test_failing_exporter_source_is_not_acted_on() -> None:
    cs = [container(n) for n in "ab"]
    ts = [task("a", "starting", 1), task("b", "starting", 2)]
    assert reasons(run(state(cs, ts, sources_ok=False))) == ["stale_state"]


def test_trigger_for_another_node_is_irrelevant() -> None:
    cs = [container(n) for n in "ab"]
    ts = [task("a", "starting", 1), task("b", "starting", 2)]
    d = run(state(cs, ts), node="host-b")
    assert acts(d) == [] and reasons(d) == ["irrelevant_alert"]


def test_trigger_for_one_gpu_decides_that_gpu_only() -> None:
    cs = [container(n) for n in "abcd"]
    ts = [task("a", "computing", 1, gpu=0), task("b", "input", 2, gpu=0)]
    ts += [task("c", "computing", 3, gpu=1), task("d", "input", 4, gpu=1)]
    st = state(cs, ts, util=1.0, gpus=2)
    assert acts(run(st, gpu=1)) == [(PAUSE, "d")]
    assert acts(run(st)) == [(PAUSE, "b"), (PAUSE, "d")]


def test_container_we_paused_whose_task_is_gone_is_released() -> None:
    d = run(state([container("a", paused=True)], []), ours("a"))
    assert acts(d) == [(UNPAUSE, "a")]
    assert d.steps[0].reason == "task_gone"


# --- devices: MIG instances and gangs ------------------------------------------------------


def test_mig_instances_are_separate_queues() -> None:
    # issue 8: the MIG index was dropped and hardware-isolated instances queued together
    cs = [container("a"), container("b")]
    ts = [task("a", "computing", 1, mig=0), task("b", "input", 2, mig=1)]
    assert acts(run(state(cs, ts, migs=2))) == []
    ts = [task("a", "computing", 1, mig=1), task("b", "input", 2, mig=1)]
    assert acts(run(state(cs, ts, migs=2))) == [(PAUSE, "b")]


def test_mig_instance_admits_its_own_waiting_task() -> None:
    cs = [container("a"), container("b", paused=True), container("c", paused=True)]
    ts = [task("a", "computing", 1, mig=0), task("b", "input", 2, mig=0, paused=True)]
    ts.append(task("c", "input", 3, mig=1, paused=True))
    assert acts(run(state(cs, ts, migs=2), ours("b", "c"))) == [(UNPAUSE, "c")]


def test_container_on_two_gpus_is_admitted_on_all_or_none() -> None:
    # issue 8: it slipped past admission on its busy GPU as runs_elsewhere
    cs = [container("a"), container("b")]
    ts = [task("b", "computing", 1, gpu=0), task("a", "input", 2, gpu=0)]
    ts += [task("a", "computing", 3, gpu=1, pid=4242)]
    d = run(state(cs, ts, util=1.0, gpus=2))
    assert acts(d) == [(PAUSE, "a")] and d.steps[0].reason == "gang"
    assert "runs_elsewhere" not in reasons(d)


def test_gang_is_admitted_once_every_gpu_has_room() -> None:
    cs = [container("a", paused=True)]
    ts = [task("a", "input", 1, gpu=0, paused=True), task("a", "input", 1, gpu=1, paused=True)]
    assert acts(run(state(cs, ts, gpus=2), ours("a"))) == [(UNPAUSE, "a")]


def test_gang_keeps_its_place_while_one_gpu_is_busy() -> None:
    # a waits for GPU 1; c, behind it, must not take GPU 0 meanwhile (a would starve)
    cs = [container("a", paused=True), container("b"), container("c", paused=True)]
    ts = [task("b", "computing", 0, gpu=1)]
    ts += [task("a", "input", 1, gpu=0, paused=True), task("a", "input", 1, gpu=1, paused=True)]
    ts += [task("c", "input", 2, gpu=0, paused=True)]
    d = run(state(cs, ts, util=[0.0, 1.0], gpus=2), ours("a", "c"))
    assert acts(d) == []
    newcomer = [task("d", "starting", 3, gpu=0)]
    d = run(state([*cs, container("d")], ts + newcomer, util=[0.0, 1.0], gpus=2), ours("a", "c"))
    assert acts(d) == [(PAUSE, "d")]


def test_gangs_that_block_each_other_let_the_earliest_run() -> None:
    # a is first on GPU 0, b first on GPU 1: without a rule both would wait forever
    cs = [container("a", paused=True), container("b", paused=True)]
    ts = [
        task("a", "input", 1, gpu=0, paused=True),
        task("b", "input", 2, gpu=0, paused=True),
        task("b", "input", 1.5, gpu=1, paused=True),
        task("a", "input", 2.5, gpu=1, paused=True),
    ]
    assert acts(run(state(cs, ts, gpus=2), ours("a", "b"))) == [(UNPAUSE, "a")]


# --- headroom ----------------------------------------------------------------------------------


def test_light_tasks_are_admitted_together_while_they_fit() -> None:
    cs = [container("a", demand=0.4)]
    cs += [container(n, paused=True, demand=0.4) for n in "bc"]
    ts = [task("a", "computing", 1, sm=0.4)]
    ts += [task(n, "input", i + 2, paused=True) for i, n in enumerate("bc")]
    d = run(state(cs, ts, util=0.4), ours("b", "c"))
    assert acts(d) == [(UNPAUSE, "b")]  # 0.4 + 0.4 fit; a third 0.4 would not


def test_one_at_a_time_admits_no_light_task_beside_another() -> None:
    # --policy.one-at-a-time: paper B's admission, whatever the demands
    cs = [container("a", demand=0.4), container("b", paused=True, demand=0.4)]
    ts = [task("a", "computing", 1, sm=0.4), task("b", "input", 2, paused=True)]
    assert acts(run(state(cs, ts, util=0.4), ours("b"), one_at_a_time=True)) == []
    ts = [task("a", "draining", 1), task("b", "input", 2, paused=True)]
    d = run(state(cs, ts, util=0.0), ours("b"), one_at_a_time=True)
    assert (UNPAUSE, "b") in acts(d)


def test_light_newcomer_is_not_paused_beside_a_light_task() -> None:
    cs = [container("a", demand=0.3), container("b", demand=0.3)]
    ts = [task("a", "computing", 1, sm=0.3), task("b", "starting", 2)]
    assert acts(run(state(cs, ts, util=0.3))) == []


@pytest.mark.parametrize(
    ("running", "candidate", "util", "mem_used"),
    [
        (None, 0.4, 0.4, 4 * GIB),  # what runs has no known demand: it has the whole GPU
        (0.4, None, 0.4, 4 * GIB),  # the candidate's is unknown: it needs the whole GPU
        (0.5, 0.6, 0.5, 4 * GIB),  # does not fit
        (0.4, 0.4, 1.0, 4 * GIB),  # the GPU is saturated already
        (0.4, 0.4, 0.4, int(23.5 * GIB)),  # memory above the threshold
    ],
)
def test_no_admission_without_headroom(
    running: float | None, candidate: float | None, util: float, mem_used: int
) -> None:
    cs = [container("a", demand=running), container("b", paused=True, demand=candidate)]
    ts = [task("a", "computing", 1, sm=0.4), task("b", "input", 2, paused=True)]
    assert acts(run(state(cs, ts, util=util, mem_used=mem_used), ours("b"))) == []


def test_a_task_that_does_not_fit_is_not_overtaken() -> None:
    cs = [container("a", demand=0.5), container("b", paused=True, demand=0.6)]
    cs.append(container("c", paused=True, demand=0.3))
    ts = [task("a", "computing", 1, sm=0.5)]
    ts += [task("b", "input", 2, paused=True), task("c", "input", 3, paused=True)]
    assert acts(run(state(cs, ts, util=0.5), ours("b", "c"))) == []


# --- priority classes ----------------------------------------------------------------------------


BE = "best-effort"


def test_best_effort_is_frozen_while_a_real_time_task_runs_whatever_its_phase() -> None:
    cs = [container("r", deadline=2.0), container("t", klass=BE)]
    ts = [task("r", "computing", 2, sm=0.3), task("t", "computing", 1, sm=0.7)]
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [(PAUSE, "t")] and d.steps[0].reason == "duty_cycle"  # frozen first
    assert "kernel_running" not in reasons(d)


def test_best_effort_is_frozen_while_a_real_time_task_waits() -> None:
    cs = [container("n"), container("r", deadline=2.0, paused=True), container("t", klass=BE)]
    ts = [task("n", "computing", 1), task("r", "input", 2, paused=True)]
    ts.append(task("t", "computing", 3, sm=0.2))
    d = run(state(cs, ts, util=1.0), ours("r"), preempt=False)
    assert acts(d) == [(PAUSE, "t")]
    # with preemption the real-time task also goes before the normal one
    d = run(state(cs, ts, util=1.0), ours("r"))
    assert acts(d) == [(PAUSE, "n"), (PAUSE, "t")]
    assert [a.reason for a in d.steps] == ["preempt", "duty_cycle"]


def test_best_effort_does_not_hold_the_gpu_for_real_time_newcomers() -> None:
    cs = [container("t", klass=BE), container("r", deadline=2.0)]
    ts = [task("t", "computing", 1, sm=1.0), task("r", "starting", 2)]
    assert acts(run(state(cs, ts, util=1.0))) == [(PAUSE, "t")]  # r is not paused


def test_best_effort_is_thawed_when_no_real_time_task_runs_or_waits() -> None:
    cs = [container("r", deadline=2.0), container("t", klass=BE, paused=True)]
    ts = [task("r", "draining", 1), task("t", "computing", 2, paused=True)]
    d = run(state(cs, ts, util=0.0), ours("t"))
    assert acts(d) == [(UNPAUSE, "t")] and d.steps[0].reason == "realtime_idle"


def test_draining_real_time_task_beside_running_best_effort_freezes_nothing() -> None:
    # best-effort work keeps the GPU busy; the real-time task's kernels have stopped
    cs = [container("r", deadline=2.0), container("t", klass=BE)]
    ts = [task("r", "draining", 1, sm=0.0), task("t", "computing", 2, sm=1.0)]
    assert acts(run(state(cs, ts, util=1.0))) == []


def test_best_effort_on_another_gpu_and_beside_normal_tasks_runs_on() -> None:
    cs = [container("r", deadline=2.0), container("n"), container("t", klass=BE)]
    ts = [task("r", "computing", 1, gpu=0), task("t", "computing", 2, gpu=1, pid=7)]
    assert acts(run(state(cs, ts, util=1.0, gpus=2))) == []
    ts = [task("n", "computing", 1), task("t", "computing", 2, pid=7)]
    assert acts(run(state(cs, ts, util=1.0))) == []


def test_unmanaged_best_effort_is_never_paused() -> None:
    cs = [container("r", deadline=2.0), container("t", klass=BE, managed=False)]
    ts = [task("r", "computing", 1), task("t", "computing", 2)]
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [] and "unmanaged" in reasons(d)


def test_the_decision_names_the_devices_real_time_work_needs() -> None:
    cs = [container("r", deadline=2.0), container("n")]
    ts = [task("r", "computing", 1, gpu=1, pid=5), task("n", "computing", 2, gpu=0)]
    d = run(state(cs, ts, gpus=2))
    assert d.realtime_devices == frozenset({(1, None)})


# --- queue order -------------------------------------------------------------------------------


def test_looping_tenant_does_not_overtake_a_container_that_waited() -> None:
    # issue 8: FIFO by process start let every new task of an old process jump the queue
    # (listed as the old exporter listed them: oldest process first)
    cs = [container("w", paused=True), container("l")]
    ts = [task("l", "starting", 2, ticks=5), task("w", "input", 1, paused=True, ticks=900)]
    assert acts(run(state(cs, ts), ours("w"))) == [(PAUSE, "l"), (UNPAUSE, "w")]


@pytest.mark.parametrize(
    ("order", "expected"),
    [("fifo", ["a", "b", "c", "d"]), ("edf", ["c", "b", "a", "d"])],
)
def test_queue_order(order: str, expected: list[str]) -> None:
    st = state(
        [],
        [
            task("a", "input", 1, deadline=90),
            task("b", "input", 2, deadline=40),
            task("c", "input", 3, deadline=10),
            task("d", "input", 4),
        ],
    )
    assert [t.container for t in queue_order(st.tasks, order)] == expected


def test_decide_is_pure_and_repeatable() -> None:
    cs = [container(n) for n in "abc"]
    ts = [task(n, "starting", i + 1) for i, n in enumerate("abc")]
    st = state(cs, ts)
    assert run(st) == run(st)
    assert replace(st) == st
