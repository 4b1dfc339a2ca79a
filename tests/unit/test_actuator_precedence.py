"""Table tests of precedence and slack (gpuguard/actuator/admission/policy/precedence.py):
no harm from
what NVML cannot see (issue 24). One case per branch, through ``decide`` as in
test_actuator_policy.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuguard.actuator.admission.policy.decide import decide
from gpuguard.actuator.admission.policy.precedence import servers
from gpuguard.actuator.admission.policy.views import is_ranked
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
from tests.unit.policy_support import NOW, acts, cid, container, reasons, seen, state, task

RT = "real-time"


def run(
    st: Any,
    ledger: Ledger | None = None,
    at_risk: tuple[str, ...] = (),
    recent: Recent | None = None,
    **config: Any,
) -> Decision:
    risky = frozenset(cid(n) for n in at_risk)
    return decide(
        st, Trigger("fast", NOW), PolicyConfig(**config), ledger, recent, slo_at_risk=risky
    )


def server(name: str, deadline: float | None = 2.0, slo: float | None = None, **kw: Any) -> Any:
    """A real-time burst-mode container; ``slo``: the target of the SLO it declares."""
    c = container(name, deadline=deadline, klass=RT, **kw)
    if slo is not None:
        c["slo"] = {"metric": "tgi_request_duration", "target_s": slo, "objective": 0.99,
                    "port": 9000}  # fmt: skip
    return c


def burst(name: str, started: float, boundary: str = "open", **kw: Any) -> Any:
    t = task(name, "computing", started, **kw)
    t["boundary"] = boundary
    return t


def on(*names: str) -> Recent:
    """What the actuator learnt: ``names`` begin new tasks computing right after a drain
    (they serve, and go straight on)."""
    ids = frozenset(cid(n) for n in names)
    return Recent(straight_on=ids, serving=ids)


def merged_before(st: Any, *names: str) -> Any:
    """``st`` with a merged busy period of each of ``names`` in the recent history."""
    done = tuple(EndedTask(cid(n), NOW - 9, NOW - 5, gpu=0, boundary="merged") for n in names)
    return replace(st, recent=(*st.recent, *done))


def frozen(name: str, ago: float, admitted: dict[str, float] | None = None) -> Ledger:
    return Ledger(
        paused={cid(name): NOW - ago},
        admitted={cid(n): NOW - a for n, a in (admitted or {}).items()},
    )


def reason_of(d: Decision, name: str) -> str:
    return next(s.reason for s in d.steps if s.container_id == cid(name))


# --- what is ranked ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "boundary", "in_servers", "ranked"),
    [
        ("process", "exact", False, True),  # first appearance to exit
        ("memory", "exact", False, True),  # memory in to memory freed
        ("process", "exact", True, True),  # the operator asked for its lifetime
        ("burst", "open", False, True),  # a one-shot's: its memory shows its boundaries
        ("burst", "merged", False, True),  # a light one-shot's own host work shows as idle
        ("burst", "open", True, False),  # a server's: its requests may merge unseen
        ("burst", "merged", True, False),
    ],
)
def test_which_tasks_are_ranked(mode: str, boundary: str, in_servers: bool, ranked: bool) -> None:
    t = burst("a", 1, boundary)
    t["mode"] = mode
    (parsed,) = state([container("a")], [t]).tasks
    assert is_ranked(parsed, frozenset({cid("a")} if in_servers else ())) is ranked


def test_servers_are_long_lived_burst_containers() -> None:
    # g and r were seen serving (new tasks computing right after a drain) and their busy
    # periods merged work (g's now, r's lately); s declares an SLO; k, real-time, merged and
    # goes straight on. Not m, whose busy period merged but which was never seen going on
    # (a light one-shot: its own host work shows as idle), nor o, seen serving but never
    # merging (a repeater that keeps its memory), nor n, of the normal class, merged and
    # straight on only (a light one-shot's kernels flicker from draining back to
    # computing), nor process-mode p and q
    names = ("m", "s", "p", "g", "q", "r", "o", "k", "n")
    cs = [server(x, slo=1.0 if x in "sp" else None) for x in names]
    cs[2]["task_mode"] = cs[4]["task_mode"] = "process"
    cs[8] = container("n")
    ts = [burst("m", 1, "merged"), burst("p", 3, pid=3), burst("g", 4, "merged"),
          burst("q", 5, "merged"), burst("o", 6), burst("k", 7, "merged"),
          burst("n", 8, "merged")]  # fmt: skip
    ts[3]["mode"] = "process"
    st = merged_before(state(cs, ts), "r")
    recent = Recent(serving=on("g", "q", "r", "o").serving, straight_on=on("k", "n").straight_on)
    assert servers(st, recent.serving, recent.straight_on) == {
        cid("s"),
        cid("g"),
        cid("r"),
        cid("k"),
    }


def test_a_container_that_started_idle_is_a_server_from_its_first_request() -> None:
    # two real-time servers without SLO signals, neither seen serving or merging yet: the
    # one whose busy period began first holds the device by FIFO, and the other, which
    # loaded its model and waited for its first request, was frozen for its whole slack
    # as a one-shot would be (bench/traces.py's pair, window 7: 4 of 24 requests missed,
    # none shared); known to have started idle, it shares, as without gpuguard
    cs = [server("a", deadline=6.0), server("b", deadline=2.3)]
    ts = [burst("a", 1), burst("b", 2)]
    st = state(cs, ts, util=1.0)
    assert acts(run(st)) == [(PAUSE, "b")]
    idle = Recent(started_idle=frozenset({cid("b")}))
    assert servers(st, started_idle=idle.started_idle) == {cid("b")}
    d = run(st, recent=idle)
    assert acts(d) == [] and reasons(d) == ["not_ranked"]  # no SLO signal: b shares
    # the other way round: the ranked newcomer is not frozen for a server's busy period
    assert acts(run(st, recent=Recent(started_idle=frozenset({cid("a")})))) == []


# --- a server's busy period is never ranked --------------------------------------------------


def test_a_one_shot_is_not_paused_behind_a_servers_busy_period() -> None:
    # the server's busy period began first; FIFO paused the one-shot for all of it
    cs = [server("s"), container("o", deadline=30)]
    ts = [burst("s", 1, "merged"), task("o", "input", 2, deadline=30)]
    assert acts(run(state(cs, ts, util=1.0))) == [(PAUSE, "o")]  # s not known as a server
    assert acts(run(state(cs, ts, util=1.0), recent=on("s"))) == []


def test_a_server_without_slo_signal_shares_with_a_one_shot_that_came_first() -> None:
    # issue 24: FIFO froze a server 13.1 s behind a long real-time one-shot; a server that
    # declares no SLO cannot be judged, so it is not frozen: it shares the device
    cs = [server("s"), container("o", deadline=30)]
    ts = [task("o", "computing", 1, deadline=30, age=8.0), burst("s", 2, age=0.1)]
    st = merged_before(state(cs, ts, util=1.0), "s")
    d = run(st, recent=on("s"))
    assert acts(d) == [] and "not_ranked" in reasons(d)
    # one this actuator froze before it was known to be a server is thawed
    d = run(st, frozen("s", 0.3), recent=on("s"))
    assert acts(d) == [(UNPAUSE, "s")] and d.steps[0].reason == "admit"


def test_a_normal_task_is_not_frozen_for_a_real_time_servers_busy_period() -> None:
    # class precedence, too, acts only between ranked tasks
    cs = [server("s"), container("n")]
    ts = [burst("s", 2, "merged"), task("n", "computing", 1)]
    assert acts(run(state(cs, ts, util=1.0))) == [(PAUSE, "n")]
    assert acts(run(state(cs, ts, util=1.0), recent=on("s"))) == []


# --- two servers ---------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["fifo", "edf"])
def test_two_servers_without_slo_signals_share(order: str) -> None:
    # issue 24: FIFO made one worse than sharing, EDF the other (their busy periods were
    # ranked as if they were tasks)
    cs = [server("t", deadline=1.5), server("l", deadline=4.0)]
    ts = [burst("t", 2, "merged", age=0.2), burst("l", 1, "merged", age=6.0)]
    assert acts(run(state(cs, ts, util=1.0), order=order)) != []  # not known as servers
    assert acts(run(state(cs, ts, util=1.0), order=order, recent=on("t", "l"))) == []


def test_two_servers_that_go_straight_on_share_and_neither_yields() -> None:
    # the yield made two servers take turns at every drain (bench/realtime.py's pair)
    cs = [server("a"), server("b", paused=True)]
    ts = [task("a", "draining", 1, deadline=2.0), burst("b", 2, paused=True)]
    d = run(merged_before(state(cs, ts), "a", "b"), frozen("b", 0.2), recent=on("a", "b"))
    assert acts(d) == [(UNPAUSE, "b")] and d.steps[0].reason == "admit"


def test_a_server_between_requests_does_not_yield_to_a_waiter() -> None:
    # its last busy period ended 0.3 s ago, its next is coming: a repeater would be frozen
    # for the waiter (yield) and wait up to --policy.max-yield; a server is not
    cs = [server("s"), container("b", paused=True)]
    ts = [task("b", "input", 2, paused=True)]
    st = merged_before(state(cs, ts), "s")
    st = replace(st, recent=(replace(st.recent[0], ended_at=NOW - 0.3),))
    d = run(st, Ledger(paused={cid("b"): NOW - 1}), recent=on("s"))
    assert acts(d) == [(UNPAUSE, "b")]


def test_two_servers_neither_at_risk_share() -> None:
    cs = [server("a", slo=2.0), server("b", slo=2.0)]
    ts = [burst("a", 1, age=3.0), burst("b", 2, age=0.5)]
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [] and reasons(d) == []


def test_of_two_servers_the_one_at_risk_goes_first() -> None:
    cs = [server("a", slo=2.0), server("b", slo=2.0)]
    ts = [burst("a", 1, age=3.0), burst("b", 2, age=0.5)]
    d = run(state(cs, ts, util=1.0), at_risk=("b",))
    assert acts(d) == [(PAUSE, "a")] and d.steps[0].reason == "preempt"
    assert d.next_due == pytest.approx(NOW + 1.5)  # its slack: 2 s less the 0.5 s margin
    d = run(state(cs, ts, util=1.0), at_risk=("a",))
    assert acts(d) == [(PAUSE, "b")]
    # both at risk: neither can afford a wait
    assert acts(run(state(cs, ts, util=1.0), at_risk=("a", "b"))) == []


def test_a_server_waits_for_one_at_risk_only_while_its_busy_period_runs() -> None:
    cs = [server("a", slo=2.0), server("b", slo=2.0, paused=True)]
    ts = [burst("a", 1, age=0.5), burst("b", 2, paused=True)]
    assert acts(run(state(cs, ts, util=1.0), frozen("b", 0.4), at_risk=("a",))) == []
    ts[0] = task("a", "draining", 1)
    d = run(state(cs, ts), frozen("b", 0.4), at_risk=("a",))
    assert acts(d) == [(UNPAUSE, "b")] and d.steps[0].reason == "admit"


def test_a_server_that_no_longer_affords_a_wait_is_thawed() -> None:
    # its own SLO alert began to fire while it waited
    cs = [server("a", slo=2.0), server("b", slo=2.0, paused=True)]
    ts = [burst("a", 1, age=0.5), burst("b", 2, paused=True)]
    d = run(state(cs, ts, util=1.0), frozen("b", 0.4), at_risk=("a", "b"))
    assert acts(d) == [(UNPAUSE, "b")]


# --- a server that can afford a bounded wait ------------------------------------------------


def oneshot_and_server(**server_kw: Any) -> tuple[list[Any], list[Any]]:
    """A long real-time one-shot computing since 8 s ago; a server (SLO declared, 2 s
    deadline) whose busy period began 0.1 s ago."""
    cs = [container("o", deadline=30), server("s", slo=2.0, **server_kw)]
    ts = [task("o", "computing", 1, deadline=30, age=8.0), burst("s", 2, age=0.1)]
    return cs, ts


def test_a_server_that_affords_a_wait_is_frozen_for_a_ranked_task() -> None:
    cs, ts = oneshot_and_server()
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [(PAUSE, "s")] and d.steps[0].reason == "preempt"
    assert d.next_due == pytest.approx(NOW + 1.5)
    ts[1] = task("s", "input", 2)
    assert reason_of(run(state(cs, ts, util=1.0)), "s") == "newcomer"
    # without preemption a server whose kernels run is left alone, as any task
    ts[1] = burst("s", 2, age=0.1)
    d = run(state(cs, ts, util=1.0), preempt=False)
    assert acts(d) == [] and "kernel_running" in reasons(d)


def test_a_servers_freeze_ends_at_its_deadline_less_the_margin() -> None:
    # the one-shot still runs: the server is thawed all the same (issue 24: it was frozen
    # 13.1 s, two of its requests missed)
    cs, ts = oneshot_and_server(paused=True)
    ts[1] = burst("s", 2, paused=True)
    d = run(state(cs, ts, util=1.0), frozen("s", 1.4))
    assert acts(d) == [] and d.next_due == pytest.approx(NOW + 0.1)
    d = run(state(cs, ts, util=1.0), frozen("s", 1.5))
    assert acts(d) == [(UNPAUSE, "s")] and d.steps[0].reason == "slack"
    d = run(state(cs, ts, util=1.0), frozen("s", 1.5), slack_margin_s=0.2)
    assert acts(d) == [] and d.next_due == pytest.approx(NOW + 0.3)


def test_its_typical_run_shortens_the_wait() -> None:
    cs, ts = oneshot_and_server(paused=True)
    cs[1]["typical_run_s"] = 0.6
    ts[1] = burst("s", 2, paused=True)
    d = run(state(cs, ts, util=1.0), frozen("s", 0.9))
    assert acts(d) == [(UNPAUSE, "s")] and d.steps[0].reason == "slack"


@pytest.mark.parametrize(
    ("typical", "longest", "thawed_after"),
    [
        # its first task: its deadline (2 s) less the margin (0.5 s)
        (None, None, 1.5),
        # it has run tasks before: what arrives as the freeze begins may be a whole request,
        # and a few short ones say nothing of a heavy tail: half its deadline is left it
        (0.1, 0.3, 0.5),
        # ... or its longest recent run shared with the holder (twice as long), where that
        # is longer (not the mean: 0.1 s would leave 1.4 s, and on bench/traces.py's pair a
        # freeze sized by the mean left a 1 s request 2.76 s against its 2.33 s deadline)
        (0.1, 0.6, 0.3),
    ],
)
def test_a_repeating_containers_freeze_leaves_it_its_longest_run_shared_or_half_its_deadline(
    typical: float | None, longest: float | None, thawed_after: float
) -> None:
    cs, ts = oneshot_and_server()
    cs[1]["typical_run_s"], cs[1]["longest_run_s"] = typical, longest
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [(PAUSE, "s")] and d.next_due == pytest.approx(NOW + thawed_after)
    cs, ts = oneshot_and_server(paused=True)
    cs[1]["typical_run_s"], cs[1]["longest_run_s"] = typical, longest
    ts[1] = burst("s", 2, paused=True)
    d = run(state(cs, ts, util=1.0), frozen("s", thawed_after - 0.05))
    assert acts(d) == [] and d.next_due == pytest.approx(NOW + 0.05)
    d = run(state(cs, ts, util=1.0), frozen("s", thawed_after))
    assert acts(d) == [(UNPAUSE, "s")] and d.steps[0].reason == "slack"


def test_a_run_as_long_as_its_deadline_less_the_margin_leaves_it_unfrozen() -> None:
    cs, ts = oneshot_and_server()
    cs[1]["typical_run_s"], cs[1]["longest_run_s"] = 0.4, 1.5
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [] and reasons(d) == ["not_ranked"]  # it cannot afford a wait: shares


@pytest.mark.parametrize("longest", [0.76, 1.2])
def test_a_run_that_shared_would_outlast_its_deadline_leaves_it_unfrozen(longest: float) -> None:
    # a 1.2 s request frozen 0.3 s (its longest run alone) then runs 2.4 s beside the
    # one-shot: 2.7 s against its 2 s deadline, where sharing from the start meets it
    cs, ts = oneshot_and_server()
    cs[1]["typical_run_s"], cs[1]["longest_run_s"] = 0.1, longest
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [] and reasons(d) == ["not_ranked"]
    cs[1]["longest_run_s"] = 0.74  # shared, 1.48 s: 0.02 s to wait
    assert acts(run(state(cs, ts, util=1.0))) == [(PAUSE, "s")]


def test_its_slo_target_is_its_deadline_without_gpuguard_deadline() -> None:
    cs, ts = oneshot_and_server(paused=True)
    cs[1]["deadline_s"] = None
    cs[1]["slo"]["target_s"] = 1.0
    ts[1] = burst("s", 2, paused=True)
    assert acts(run(state(cs, ts, util=1.0), frozen("s", 0.4))) == []
    assert acts(run(state(cs, ts, util=1.0), frozen("s", 0.5))) == [(UNPAUSE, "s")]


def test_a_thawed_server_is_not_frozen_again_for_what_held_it() -> None:
    cs, ts = oneshot_and_server()
    d = run(state(cs, ts, util=1.0), Ledger(admitted={cid("s"): NOW - 0.2}))
    assert acts(d) == [] and "no_slack" in reasons(d)
    # a task that began after its thaw may make it wait again
    ts[0] = task("o", "computing", 1, deadline=30, age=0.1)
    d = run(state(cs, ts, util=1.0), Ledger(admitted={cid("s"): NOW - 0.2}))
    assert acts(d) == [(PAUSE, "s")]


def test_for_a_server_at_risk_a_thawed_server_waits_again_after_its_deadline() -> None:
    cs = [server("a", slo=2.0), server("b", slo=2.0)]
    ts = [burst("a", 1, age=8.0), burst("b", 2, age=0.5)]
    ran = lambda s: Ledger(admitted={cid("b"): NOW - s})  # noqa: E731
    assert acts(run(state(cs, ts, util=1.0), ran(1.9), at_risk=("a",))) == []
    assert acts(run(state(cs, ts, util=1.0), ran(2.0), at_risk=("a",))) == [(PAUSE, "b")]


def test_a_server_without_slack_to_spare_never_waits() -> None:
    # a 300 ms deadline is within the 500 ms margin: it cannot afford any wait
    cs, ts = oneshot_and_server(deadline=0.3)
    cs[1]["slo"]["target_s"] = 0.3
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [] and "not_ranked" in reasons(d)


def test_a_server_does_not_wait_for_a_lower_class() -> None:
    cs, ts = oneshot_and_server()
    cs[0] = container("o")  # normal class
    ts[0] = task("o", "computing", 1, age=8.0)
    assert acts(run(state(cs, ts, util=1.0))) == []


def test_a_servers_busy_period_leaves_the_queue_to_ranked_tasks() -> None:
    # the server computes; two ranked tasks queue among themselves as before: the first
    # runs, the second waits (the server's kernels neither hold the device for them nor
    # count as saturation)
    cs = [server("s"), container("a"), container("b")]
    ts = [burst("s", 0, "merged"), task("a", "computing", 1), task("b", "input", 2)]
    d = run(state(cs, ts, util=1.0), recent=on("s"))
    assert acts(d) == [(PAUSE, "b")] and d.steps[0].reason == "newcomer"


# --- slack of ranked real-time tasks --------------------------------------------------------


def holder_and_waiter(deadline: float = 2.0, **waiter_kw: Any) -> tuple[list[Any], list[Any]]:
    """``a`` computes (FIFO first, 30 s deadline); ``b`` (real-time, ``deadline``) waits,
    paused by this actuator, its task started 1 s ago."""
    cs = [container("a", deadline=30), container("b", deadline=deadline, paused=True)]
    ts = [
        task("a", "computing", 1, deadline=30, age=5.0),
        task("b", "input", 2, deadline=deadline, paused=True, age=1.0, **waiter_kw),
    ]
    return cs, ts


def test_a_waiting_real_time_task_is_thawed_when_its_slack_is_spent() -> None:
    # its deadline counts from its task's start: 2 s, less the margin: 0.5 s more to wait
    cs, ts = holder_and_waiter()
    d = run(state(cs, ts, util=1.0), frozen("b", 1.0))
    assert acts(d) == [] and d.next_due == pytest.approx(NOW + 0.5)
    ts[1]["absolute_deadline"] = NOW + 0.4
    d = run(state(cs, ts, util=1.0), frozen("b", 1.6))
    assert acts(d) == [(UNPAUSE, "b")] and d.steps[0].reason == "slack"


def test_a_thawed_task_shares_the_device_and_the_holder_keeps_it() -> None:
    cs, ts = holder_and_waiter()
    ts[1]["absolute_deadline"] = NOW + 0.2
    ts[1]["paused"] = False
    cs[1]["paused"] = False
    d = run(state(cs, ts, util=1.0), Ledger(admitted={cid("b"): NOW - 1.0}))
    assert acts(d) == [] and "no_slack" in reasons(d)
    ts[1]["absolute_deadline"] = NOW + 2.0  # with slack left it would be frozen again
    assert acts(run(state(cs, ts, util=1.0), Ledger(admitted={cid("b"): NOW - 1.0}))) == [
        (PAUSE, "b")
    ]


def test_a_real_time_newcomer_out_of_slack_is_not_frozen() -> None:
    cs = [container("a", deadline=30), container("b", deadline=0.4)]
    ts = [task("a", "computing", 1, deadline=30), task("b", "computing", 2, deadline=0.4)]
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [] and "no_slack" in reasons(d)
    cs[1]["deadline_s"] = ts[1]["deadline_s"] = 5.0
    ts[1]["absolute_deadline"] = NOW + 4.0
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == [(PAUSE, "b")] and d.next_due == pytest.approx(NOW + 3.5)


def test_a_known_run_time_thaws_a_waiting_task_sooner() -> None:
    cs, ts = holder_and_waiter()
    cs[1]["typical_run_s"] = 0.5
    d = run(state(cs, ts, util=1.0), frozen("b", 1.0))
    assert acts(d) == [(UNPAUSE, "b")] and d.steps[0].reason == "slack"


@pytest.mark.parametrize("klass", ["normal", "real-time without deadline"])
def test_only_real_time_deadlines_bound_a_wait(klass: str) -> None:
    cs, ts = holder_and_waiter()
    if klass == "normal":
        cs[1]["class"] = "normal"
    else:
        cs[1]["deadline_s"] = ts[1]["deadline_s"] = ts[1]["absolute_deadline"] = None
    assert acts(run(state(cs, ts, util=1.0), frozen("b", 60.0))) == []


def test_a_preempted_holder_is_thawed_at_its_slack_too() -> None:
    # EDF preempted a (its 6 s deadline is later than b's): a waits no longer than its own
    cs = [container("a", deadline=6, paused=True), container("b", deadline=30)]
    ts = [
        task("a", "computing", 1, deadline=6, paused=True, age=6.0),
        task("b", "computing", 2, deadline=30, age=1.0),
    ]
    ts[0]["absolute_deadline"] = NOW + 0.5
    ts[1]["absolute_deadline"] = NOW + 0.3
    d = run(state(cs, ts, util=1.0), frozen("a", 3.0), order="edf")
    assert acts(d) == [(UNPAUSE, "a")] and d.steps[0].reason == "slack"


@pytest.mark.parametrize("why", ["merged", "late"])
def test_a_burst_that_may_hold_several_requests_counts_its_slack_from_its_freeze(
    why: str,
) -> None:
    # a's burst began 10 s ago: its first deadline says nothing of the requests it may hold
    # (as EDF reads it), so its wait counts from its freeze, as a server's does
    cs = [container("a", deadline=2.0, paused=True), container("o", deadline=30)]
    ts = [
        burst("a", 2, why if why == "merged" else "open", age=10.0, paused=True, deadline=2.0),
        task("o", "computing", 1, deadline=30, age=12.0),
    ]
    ts[0]["absolute_deadline"] = NOW - 8.0
    d = run(state(cs, ts, util=1.0), frozen("a", 1.0))
    assert acts(d) == [] and d.next_due == pytest.approx(NOW + 0.5)
    d = run(state(cs, ts, util=1.0), frozen("a", 1.5))
    assert acts(d) == [(UNPAUSE, "a")] and d.steps[0].reason == "slack"
    # thawed, it is not frozen again for the task that held it, only for one begun since
    ts[0]["paused"] = cs[0]["paused"] = False
    thawed = Ledger(admitted={cid("a"): NOW - 1.0})
    d = run(state(cs, ts, util=1.0), thawed)
    assert acts(d) == [] and "no_slack" in reasons(d)
    # (a container admitted before this task of its began waited for nothing yet: a
    # repeater's next task waits its turn)
    d = run(state(cs, ts, util=1.0), Ledger(admitted={cid("a"): NOW - 11.0}))
    assert acts(d) == [(PAUSE, "a")]
    cs[1]["deadline_s"] = 1.0  # under EDF, a tight task begun after the thaw goes first
    ts[1] = task("o", "computing", 3, deadline=1.0, age=0.3)
    d = run(state(cs, ts, util=1.0), thawed, order="edf")
    assert acts(d) == [(PAUSE, "a")] and d.steps[0].reason == "preempt"


def test_a_thawed_task_is_no_waiter_a_repeater_yields_to() -> None:
    # b is thawed for its slack while a (goes straight on) drains: a does not yield to it
    cs = [container("a"), container("b", deadline=2.0, paused=True)]
    ts = [task("a", "draining", 1), task("b", "input", 2, deadline=2.0, paused=True)]
    ts[1]["absolute_deadline"] = NOW + 0.3
    on = Recent(straight_on=frozenset({cid("a")}))
    d = run(state(cs, ts), frozen("b", 1.7), recent=on)
    assert acts(d) == [(UNPAUSE, "b")] and d.steps[0].reason == "slack"


def test_a_real_time_container_that_yielded_between_tasks_waits_no_longer_than_its_slack() -> None:
    cs = [container("a", deadline=2.0, paused=True), container("b")]
    ts = [task("b", "computing", 2)]
    yielded = lambda ago: Ledger(paused={cid("a"): NOW - ago}, yielded={cid("a"): 0})  # noqa: E731
    d = run(state(cs, ts, util=1.0), yielded(1.0))
    assert acts(d) == [] and d.next_due == pytest.approx(NOW + 0.5)
    d = run(state(cs, ts, util=1.0), yielded(1.5))
    assert acts(d) == [(UNPAUSE, "a")] and d.steps[0].reason == "slack"
    cs[0]["class"] = "normal"  # no slack to keep: it waits for its turn
    assert acts(run(state(cs, ts, util=1.0), yielded(1.5))) == []


# --- the case, end to end in the policy ---------------------------------------------


def test_a_long_one_shot_freezes_a_server_for_less_than_its_request_deadline() -> None:
    # a server with 2 s request deadlines whose requests the exporter has seen one by one
    # (its bursts are ranked) beside a real-time one-shot that runs for 13 s: the server's
    # burst that came after the one-shot waits, thawed 1.5 s after it began, and then
    # shares the device (FIFO froze it for the whole one-shot: 13.1 s)
    cs = [container("o", deadline=30), server("s", paused=True)]
    ts = [task("o", "computing", 1, deadline=30, age=8.0), burst("s", 2, age=1.0, paused=True)]
    ts[1]["absolute_deadline"] = NOW + 1.0
    d = run(state(cs, ts, util=1.0), frozen("s", 1.0))
    assert acts(d) == [] and d.next_due == pytest.approx(NOW + 0.5)
    ts[1]["absolute_deadline"] = NOW + 0.5
    d = run(state(cs, ts, util=1.0), frozen("s", 1.5))
    assert acts(d) == [(UNPAUSE, "s")] and d.steps[0].reason == "slack"
    # once it runs, the same burst is not frozen again: its slack is spent
    ts[1] = burst("s", 2, age=2.1)
    ts[1]["absolute_deadline"] = NOW - 0.1
    cs[1]["paused"] = False
    d = run(state(cs, ts, util=1.0), Ledger(admitted={cid("s"): NOW - 0.6}))
    assert acts(d) == [] and "no_slack" in reasons(d)


# --- two servers seen exactly: a sooner request goes first ----------------------------------


def exact_pair(
    t_age: float = 0.1, l_age: float = 0.2, l_longest: float | None = 0.5, source: str = "launch"
) -> tuple[list[Any], list[Any]]:
    """Two real-time servers without SLO signals, both known as servers: ``t`` (deadline
    1.5 s) whose request began ``t_age`` ago, ``l`` (4 s, longest run ``l_longest``) whose
    busy period began ``l_age`` ago, both computing on GPU 0, seen by ``source``."""
    cs = [
        seen(server("t", deadline=1.5), source, busy=True),
        seen(server("l", deadline=4.0), source, busy=True),
    ]
    cs[0]["longest_run_s"] = 0.3
    cs[1]["longest_run_s"] = l_longest
    ts = [burst("t", 2, "open", age=t_age), burst("l", 1, "open", age=l_age)]
    for c, t in zip(cs, ts, strict=True):
        if "activity" in c:
            c["activity"]["busy_since"] = t["started_at"]
    return cs, ts


def request_began(c: dict[str, Any], ago: float, boundary: str = "open") -> dict[str, Any]:
    """``c``'s busy period as the probe shows it, begun ``ago`` (its task too)."""
    c["activity"]["busy_since"] = NOW - ago
    return burst(c["name"], 2, boundary, age=ago)


#: both known as servers: each sat on the GPU a second before its first kernel
BOTH = Recent(started_idle=frozenset({cid("t"), cid("l")}))


def test_a_server_seen_exactly_waits_for_a_request_due_before_any_of_its_own() -> None:
    # bench/traces.py's pair: the tight server's requests ran beside the loose one's, which
    # had seconds to spare; seen exactly, each request's start is known
    cs, ts = exact_pair()
    d = run(state(cs, ts, util=1.0), recent=BOTH)
    assert acts(d) == [(PAUSE, "l")] and d.steps[0].reason == "preempt"
    # its wait ends at its busy period's start + 4 s - max(2 x 0.5 s, half of 4 s) - 0.5 s
    assert d.next_due == pytest.approx(NOW - 0.2 + 1.5)


def test_which_server_waits_is_whichever_request_falls_due_later() -> None:
    # the loose server's busy period began 3 s ago: its first request is due in 1 s, before
    # the tight one's (1.5 s from now), so the tight one waits, within its own slack
    cs, ts = exact_pair(t_age=0.0, l_age=3.0, l_longest=0.2)
    cs[0]["longest_run_s"] = 0.1
    d = run(state(cs, ts, util=1.0), recent=BOTH)
    assert acts(d) == [(PAUSE, "t")]
    assert d.next_due == pytest.approx(NOW + 1.5 - 0.75 - 0.5)


def test_servers_not_timed_by_the_probe_still_share() -> None:
    # NVML's busy periods begin up to a sample late: no request's due time is known
    cs, ts = exact_pair()
    cs = [container_without_activity(c) for c in cs]
    d = run(state(cs, ts, util=1.0), recent=BOTH)
    assert acts(d) == []
    # one of the two seen exactly is not enough: both must be
    cs[0] = seen(cs[0], busy=True)
    assert acts(run(state(cs, ts, util=1.0), recent=BOTH)) == []
    # a polled in-flight gauge may show a busy period's start late: the waiter's slack
    # could not be counted from it
    cs[1] = seen(cs[1], "gauge", inflight=1)
    cs[1]["activity"].update(busy=True, busy_since=ts[1]["started_at"], in_flight=True)
    assert acts(run(state(cs, ts, util=1.0), recent=BOTH)) == []
    cs[1] = seen(cs[1], busy=True)
    cs[1]["activity"]["busy_since"] = ts[1]["started_at"]
    assert acts(run(state(cs, ts, util=1.0), recent=BOTH)) == [(PAUSE, "l")]


def container_without_activity(c: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in c.items() if k != "activity"}


def test_a_server_whose_run_is_not_learnt_yet_does_not_wait() -> None:
    # its first requests' length is unknown: no slack can be sized
    cs, ts = exact_pair(l_longest=None)
    assert acts(run(state(cs, ts, util=1.0), recent=BOTH)) == []


def test_a_server_whose_busy_period_spent_its_slack_is_not_frozen() -> None:
    # its busy period began 1.6 s ago: the first request in it has 4 - 1.6 s left, less
    # its run shared and the margin: nothing to spare
    cs, ts = exact_pair(l_age=1.6)
    d = run(state(cs, ts, util=1.0), recent=BOTH)
    assert acts(d) == [] and reasons(d) == ["no_slack"]


def test_a_server_draining_its_output_is_not_frozen() -> None:
    cs, ts = exact_pair()
    ts[1] = task("l", "draining", 1, age=0.2)
    ts[1]["boundary"] = "open"
    assert acts(run(state(cs, ts, util=1.0), recent=BOTH)) == []


def test_the_waiting_server_is_thawed_when_the_sooner_request_ends() -> None:
    cs, ts = exact_pair()
    cs[1]["paused"], cs[1]["state"] = True, "paused"
    ts[1]["paused"] = True
    ledger = frozen("l", 0.05)
    assert acts(run(state(cs, ts, util=1.0), ledger, recent=BOTH)) == []  # t still runs
    cs[0] = seen(server("t", deadline=1.5), busy=False, last=(NOW - 0.1, NOW - 0.005))
    d = run(state(cs, ts, util=1.0), ledger, recent=BOTH)  # its idle edge, before a poll
    assert acts(d) == [(UNPAUSE, "l")] and d.steps[0].reason == "admit"
    d = run(state(cs, ts[1:], util=1.0), ledger, recent=BOTH)  # the poll: its task ended
    assert acts(d) == [(UNPAUSE, "l")]


def test_the_waiting_server_is_thawed_at_its_slack_though_the_request_runs_on() -> None:
    cs, ts = exact_pair(l_age=1.6)
    cs[1]["paused"], cs[1]["state"] = True, "paused"
    ts[1]["paused"] = True
    d = run(state(cs, ts, util=1.0), frozen("l", 1.0), recent=BOTH)
    assert acts(d) == [(UNPAUSE, "l")] and d.steps[0].reason == "slack"


def test_a_server_whose_slack_ends_before_the_sooner_request_shares() -> None:
    # thawed for its slack while the request runs, its work would only move later into the
    # same request (or the next the other server queued): it shares from the start instead
    cs, ts = exact_pair()
    cs[0]["longest_run_s"] = 2.0  # the tight request may run 1.9 s more; l's wait ends in 1.3
    d = run(state(cs, ts, util=1.0), recent=BOTH)
    assert acts(d) == [] and reasons(d) == ["no_slack"]
    # a busy period that ran past its longest run merged requests, and the one running
    # now may have just begun: its whole run is left
    cs[0]["longest_run_s"] = 1.4
    ts[0] = request_began(cs[0], 2.0)
    assert acts(run(state(cs, ts, util=1.0), recent=BOTH)) == []
    cs[0]["longest_run_s"] = 2.5  # one request, with 0.5 s to go
    assert acts(run(state(cs, ts, util=1.0), recent=BOTH)) == [(PAUSE, "l")]
