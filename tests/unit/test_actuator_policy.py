"""Table tests of the admission policy (actuator.policy.decide): one case per branch."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuguard.actuator.policy import (
    PAUSE,
    UNPAUSE,
    Decision,
    Ledger,
    PolicyConfig,
    Trigger,
    decide,
    queue_order,
)
from gpuguard.actuator.state import parse_state

NOW = 1_000_000.0
GIB = 2**30


def container(
    name: str, managed: bool = True, paused: bool = False, role: str | None = None
) -> dict[str, Any]:
    return {
        "id": cid(name),
        "name": name,
        "image": "gpuguard/base:local",
        "state": "paused" if paused else "running",
        "paused": paused,
        "managed": managed,
        "deadline_s": None,
        "deadline_error": None,
        "gpus": ["0"],
        "role": role,
    }


def cid(name: str) -> str:
    return (name.encode().hex() * 64)[:64]


def task(
    name: str | None,
    phase: str,
    started: float,
    gpu: int = 0,
    deadline: float | None = None,
    paused: bool = False,
    pid: int = 0,
    age: float | None = None,
) -> dict[str, Any]:
    """A task; ``started`` orders tasks, ``age`` (default about 1 s) is how long it runs."""
    pid = pid or 1000 + int(started * 10) % 9000
    started_at = NOW - (age if age is not None else 1.0 - started * 0.01)
    return {
        "task_id": f"{cid(name)[:12] if name else '-'}:{pid}:{int(started)}:1",
        "container_id": cid(name) if name else None,
        "container": name,
        "pid": pid,
        "gpu": gpu,
        "phase": phase,
        "started_at": started_at,
        "proc_start_ticks": int(started * 100),
        "elapsed_s": NOW - started_at,
        "memory_bytes": GIB,
        "sm_ratio": 1.0 if phase == "computing" else 0.0,
        "deadline_s": deadline,
        "absolute_deadline": None if deadline is None else started_at + deadline,
        "slack_s": None,
        "overrun": False,
        "paused": paused,
    }


def state(
    containers: list[dict[str, Any]],
    tasks: list[dict[str, Any]],
    util: float = 0.0,
    mem_used: int = 4 * GIB,
    gpus: int = 1,
    timestamp: float = NOW,
    sources_ok: bool = True,
) -> Any:
    return parse_state(
        {
            "node": "host-a",
            "seq": 7,
            "timestamp": timestamp,
            "poll_interval_s": 0.02,
            "sources": {"gpu": sources_ok, "docker": True, "procfs": True},
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-{i}",
                    "name": "gpusim",
                    "memory_total_bytes": 24 * GIB,
                    "memory_used_bytes": mem_used,
                    "utilization_ratio": util,
                    "sm_ratio": util,
                }
                for i in range(gpus)
            ],
            "containers": containers,
            "tasks": tasks,
            "recent": [],
        }
    )


def run(
    st: Any,
    ledger: Ledger | None = None,
    gpu: int | None = None,
    node: str | None = None,
    **config: Any,
) -> Decision:
    return decide(st, Trigger("fast", NOW, node=node, gpu=gpu), PolicyConfig(**config), ledger)


def ours(*names: str, at: float = NOW - 1) -> Ledger:
    return Ledger(paused={cid(n): at for n in names})


def acts(decision: Decision) -> list[tuple[str, str]]:
    names = {cid(n): n for n in "abcdefghijklmnopqrstuvwxyz"}
    names.update({cid(f"c{i}"): f"c{i}" for i in range(20)})
    return [(a.kind, names.get(a.container_id, a.container_id)) for a in decision.actions]


def reasons(decision: Decision) -> list[str]:
    return [s.reason for s in decision.skips]


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


def test_finished_kernel_frees_the_gpu_before_the_exporter_says_draining() -> None:
    cs = [container("a"), container("b", paused=True)]
    done = task("a", "computing", 1)
    done["sm_ratio"] = 0.0
    ts = [done, task("b", "input", 2, paused=True)]
    assert acts(run(state(cs, ts, util=0.7), ours("b"))) == [(UNPAUSE, "b")]
    # while the device was busy all of the last period, a missing sample proves nothing
    assert acts(run(state(cs, ts, util=1.0), ours("b"))) == []
    done["sm_ratio"] = None  # NVML cannot tell: still computing
    assert acts(run(state(cs, ts, util=0.7), ours("b"))) == []


def test_newcomer_whose_kernel_already_runs_is_left_alone() -> None:
    cs = [container("a"), container("b")]
    ts = [task("a", "computing", 1), task("b", "computing", 2)]
    d = run(state(cs, ts, util=1.0))
    assert acts(d) == []
    assert "kernel_running" in reasons(d)


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
    ledger = Ledger(admitted={cid("b"): NOW - 0.5}, last_admitted={0: cid("b")})
    assert acts(run(state(cs, ts), ledger)) == [(PAUSE, "a")]


def test_stale_docker_view_of_a_just_admitted_container_is_overridden() -> None:
    # We unpaused b 0.2 s ago; the snapshot (older) still shows it paused. The GPU must not
    # look free, or c would be admitted too.
    cs = [container("b", paused=True), container("c", paused=True)]
    ts = [task("b", "input", 2, paused=True), task("c", "input", 3, paused=True)]
    ledger = Ledger(
        paused={cid("c"): NOW - 5}, admitted={cid("b"): NOW - 0.2}, last_admitted={0: cid("b")}
    )
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
    ledger = Ledger(admitted={cid("b"): NOW - 0.3}, last_admitted={0: cid("b")})
    d = run(state(cs, ts, mem_used=int(23.5 * GIB)), ledger)
    assert acts(d) == [(PAUSE, "b")]
    assert d.actions[0].reason == "memory_pressure"


def test_memory_rule_leaves_a_last_admitted_task_that_computes() -> None:
    cs = [container("b")]
    ts = [task("b", "computing", 2)]
    ledger = Ledger(admitted={cid("b"): NOW - 3}, last_admitted={0: cid("b")})
    assert acts(run(state(cs, ts, util=1.0, mem_used=int(23.5 * GIB)), ledger)) == []


# --- caps, scope, staleness, clean-up ------------------------------------------------------


def test_cap_limits_containers_touched_per_decision() -> None:
    names = [f"c{i}" for i in range(14)]
    cs = [container(n) for n in names]
    ts = [task(n, "starting", i + 1) for i, n in enumerate(names)]
    d = run(state(cs, ts), max_actions=10)
    assert len(d.actions) == 10
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
    assert d.actions[0].reason == "task_gone"


def test_container_running_a_kept_task_on_another_gpu_is_not_paused() -> None:
    cs = [container("a"), container("b")]
    ts = [task("b", "computing", 1, gpu=0), task("a", "input", 2, gpu=0)]
    ts += [task("a", "computing", 3, gpu=1, pid=4242)]
    d = run(state(cs, ts, util=1.0, gpus=2))
    assert acts(d) == []
    assert "runs_elsewhere" in reasons(d)


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
