"""``bench/realtime.py``'s pure parts: kernel overlap, flaps and action counts from the audit
log, the per-scenario actuator flags; and the bursty arrivals it feeds the servers."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import realtime

from gpuguard.gpusim.workload.arrivals import Bursts, bursty_arrivals, parse_trace, trace_lines


def test_overlap_counts_only_time_two_containers_ran_at_once() -> None:
    spans = {"rt-1": [(0.0, 2.0), (3.0, 4.0)], "rt-2": [(1.5, 3.5)], "rt-3": [(10.0, 11.0)]}
    assert realtime.overlap_s(spans) == pytest.approx(0.5 + 0.5)
    # a container's own kernels never overlap each other; touching spans are no overlap
    assert realtime.overlap_s({"a": [(0.0, 2.0), (1.0, 3.0)], "b": [(3.0, 4.0)]}) == 0.0
    assert realtime.overlap_s({"a": [(0.0, 4.0)], "b": [(1.0, 2.0)], "c": [(1.5, 3.0)]}) == (
        pytest.approx(2.0)
    )
    assert realtime.overlap_s({}) == 0.0


def test_kernel_spans_prefer_the_devices_own_times() -> None:
    lines = [
        json.dumps({"event": "kernel_start", "run": 0, "t": 1.0}),
        json.dumps({"event": "kernel_end", "run": 0, "t": 3.0, "device_started": 1.2,
                    "device_ended": 2.9}),
        json.dumps({"event": "kernel_start", "run": 1, "t": 5.0}),
        json.dumps({"event": "kernel_end", "run": 1, "t": 6.0, "device_started": None,
                    "device_ended": None}),
        '{"event": "kernel_start", "run": 2, "t": 7',  # cut short by the container's end
    ]  # fmt: skip
    device, host = realtime.kernel_spans(lines)
    assert device == [(1.2, 2.9), (5.0, 6.0)]
    assert host == [(1.0, 3.0), (5.0, 6.0)]


def _action(t: float, action: str, container: str = "be", result: str = "ok") -> dict[str, Any]:
    return {
        "ts": t, "finished": t, "event": "action", "action": action, "container": container,
        "result": result, "reason": "best_effort" if action == "pause" else "realtime_idle",
    }  # fmt: skip


def test_flaps_pair_each_freeze_with_its_thaw() -> None:
    audit = [
        _action(1.0, "pause"),
        _action(1.5, "unpause"),
        _action(1.6, "pause"),  # 100 ms after the thaw
        _action(1.7, "pause", result="already"),
        _action(2.0, "unpause"),
        _action(3.0, "pause"),
        _action(3.1, "pause", container="other"),
    ]
    assert realtime.flaps(audit, "be") == (2, 1)
    assert realtime.flaps([], "be") == (0, 0)


def test_action_counts_by_kind_reason_and_result() -> None:
    audit = [
        _action(1.0, "pause"),
        _action(2.0, "pause", result="failed"),
        _action(3.0, "unpause"),
        {"ts": 4.0, "event": "skip", "reason": "kernel_running"},
        {"ts": 5.0, "event": "start"},
    ]
    assert realtime.action_counts(audit) == {
        "pause/best_effort": 1,
        "pause/best_effort (failed)": 1,
        "skip/kernel_running": 1,
        "unpause/realtime_idle": 1,
    }


def test_actuator_flags_per_scenario() -> None:
    sets = realtime.parse_flag_sets(["pair=--policy.preempt --max-pause 30s", "all=--dry-run"])
    assert sets == {"pair": ["--policy.preempt", "--max-pause", "30s"], "all": ["--dry-run"]}
    assert realtime.parse_flag_sets(["c=--policy.order=edf"]) == {"dense": ["--policy.order=edf"]}
    with pytest.raises(argparse.ArgumentTypeError, match="unknown scenario"):
        realtime.parse_flag_sets(["nope=--x"])
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=FLAGS"):
        realtime.parse_flag_sets(["--policy.preempt"])
    flags = ["--policy.order=edf", "--policy.preempt", "--policy.order", "fifo"]
    assert realtime.split_order(flags) == ("fifo", ["--policy.preempt"])
    assert realtime.split_order([]) == ("fifo", [])


def test_every_scenario_has_its_keys_and_a_target() -> None:
    keys = [key for s in realtime.SCENARIOS for key in s.keys]
    assert len(keys) == len(set(keys))
    assert {s.letter for s in realtime.SCENARIOS} == set("abcde")
    for scenario in realtime.SCENARIOS:
        assert scenario.met(dict.fromkeys(scenario.keys)) is None  # nothing measured: no verdict
    pair = realtime.scenario_named("b")
    rates = {"pair_tight_hit_rate_shared": 0.8, "pair_tight_hit_rate_managed": 0.8,
             "pair_loose_hit_rate_shared": 1.0, "pair_loose_hit_rate_managed": 1.0}  # fmt: skip
    assert pair.met(rates) is True  # neither server below sharing (issue 24)
    assert pair.met({**rates, "pair_loose_hit_rate_managed": 0.79}) is False
    assert pair.met({**rates, "pair_tight_hit_rate_managed": 0.7}) is False


def test_a_missing_hook_gives_null_keys_and_a_note() -> None:
    scenario = realtime.Scenario(
        "later", "z", ("later_key",), realtime.hook("bench.no_such_module", "measure")
    )
    outcome = scenario.measure(None, scenario)  # type: ignore[arg-type]
    assert outcome.figures == {"later_key": None}
    assert "not available yet" in outcome.notes[0]


def test_bursty_arrivals_are_bursty_heavy_tailed_and_round_trip_as_a_trace() -> None:
    bursts = Bursts(1.8, sigma=0.7, period=20.0, span=10.0, size=(20, 30), background_rate=0.2)
    arrivals = bursty_arrivals(bursts, 60.0, 1024, seed=5)
    assert arrivals == bursty_arrivals(bursts, 60.0, 1024, seed=5)
    offsets = [a.offset for a in arrivals]
    assert offsets == sorted(offsets) and offsets[0] >= 0 and offsets[-1] < 60.0
    # three bursts of 20-30 (each within 14 s of its period's start) over a light background
    assert 60 <= len(arrivals) <= 90 + 30
    in_bursts = sum(o % 20.0 < 14.0 for o in offsets)
    assert in_bursts >= 0.8 * len(arrivals)
    works = [a.work for a in arrivals]
    assert statistics.median(works) == pytest.approx(1.8, rel=0.3)
    assert max(works) <= 18.0 and max(works) > 3 * statistics.median(works)
    again = parse_trace(trace_lines(arrivals), work=1.0, nbytes=0)
    assert [(a.offset, a.nbytes) for a in again] == [(round(o, 6), 1024) for o in offsets]
