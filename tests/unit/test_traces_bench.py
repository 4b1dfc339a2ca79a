"""``bench/traces.py``'s pure parts: the trace subsets checked and parsed, windows, the token
model, the deadlines, who runs where, and the judging from workload logs and audit records."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import traces
from replay import judge, trace
from replay.trace import Job, Request, TraceError, TraceFile, Window

from gpuguard.demo.stack.scenario import RequestResult, ScenarioResult, StepResult

BENCH = Path(__file__).resolve().parents[2] / "bench"
HEADER = trace.HEADER + "\n"


def write_trace(path: Path, rows: list[tuple[float, int, int]]) -> str:
    path.write_text(HEADER + "".join(f"{t:.3f},{c},{g}\n" for t, c, g in rows))
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the subsets --------------------------------------------------------------------------


def test_a_trace_parses_in_time_order() -> None:
    got = trace.parse_trace_csv([trace.HEADER, "0.000,10,2", "", "1.500,300,0"], "t.csv")
    assert got == [Request(0.0, 10, 2), Request(1.5, 300, 0)]


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        (["TIMESTAMP,ContextTokens,GeneratedTokens"], "line 1: expected the header"),
        ([trace.HEADER, "0.0,1"], "line 2: 3 fields expected, got 2"),
        ([trace.HEADER, "0.0,1,x"], "line 2: invalid literal"),
        ([trace.HEADER, "0.0,-1,2"], "line 2: values must be >= 0"),
        ([trace.HEADER, "nan,1,2"], "line 2: values must be >= 0"),
        ([trace.HEADER, "2.0,1,2", "1.0,1,2"], "line 3: offset goes back in time"),
        ([trace.HEADER], "no requests"),
    ],
)
def test_a_malformed_trace_is_one_line_naming_where(lines: list[str], said: str) -> None:
    with pytest.raises(TraceError) as caught:
        trace.parse_trace_csv(lines, "t.csv")
    assert said in str(caught.value) and str(caught.value).startswith("t.csv: ")
    assert "\n" not in str(caught.value)


def test_a_subset_whose_bytes_changed_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    digest = write_trace(path, [(0.0, 5, 1)])
    assert trace.load_trace(path, digest) == [Request(0.0, 5, 1)]
    path.write_text(path.read_text() + "1.000,5,1\n")
    with pytest.raises(TraceError, match=f"expected {digest}: not the subset"):
        trace.load_trace(path, digest)
    with pytest.raises(TraceError, match="No such file"):
        trace.load_trace(tmp_path / "gone.csv", digest)


def test_the_first_directory_holding_every_subset_is_used(tmp_path: Path) -> None:
    partial, full = tmp_path / "partial", tmp_path / "full"
    for directory, files in ((partial, trace.TRACE_FILES[:1]), (full, trace.TRACE_FILES)):
        directory.mkdir()
        for t in files:
            (directory / t.file).write_text(HEADER)
    assert trace.find_trace_dir([tmp_path / "none", partial, full]) == full
    with pytest.raises(TraceError) as caught:
        trace.find_trace_dir([tmp_path / "none", partial])
    assert str(tmp_path / "none") in str(caught.value) and "--trace-dir" in str(caught.value)
    repo = tmp_path / "checkout"
    assert trace.trace_dirs(repo) == [
        repo / "bench" / "traces",
        repo / "shared" / "traces",
        tmp_path / "shared" / "traces",
    ]


def test_a_worktree_also_looks_beside_its_main_checkout(tmp_path: Path) -> None:
    """A ``git worktree`` checkout elsewhere finds the ``shared/`` beside its main checkout."""
    main, tree = tmp_path / "main", tmp_path / "trees" / "branch"
    (main / ".git" / "worktrees" / "branch").mkdir(parents=True)
    tree.mkdir(parents=True)
    (tree / ".git").write_text(f"gitdir: {main / '.git' / 'worktrees' / 'branch'}\n")
    assert trace.main_checkout(tree) == main
    assert trace.trace_dirs(tree)[-1] == tmp_path / "shared" / "traces"
    assert trace.main_checkout(main) is None  # .git a directory: a plain clone
    (tree / ".git").write_text("gitdir: /somewhere/else\n")
    assert trace.main_checkout(tree) is None
    assert len(trace.trace_dirs(tree)) == 3


def test_the_readme_names_every_subset_with_its_sha256_and_source() -> None:
    text = (BENCH / "traces" / "README.md").read_text()
    for t in trace.TRACE_FILES:
        assert f"`{t.file}` | {t.rows:,} | `{t.sha256}`" in text
    assert "b469a113cedca53ddc3bdea71a143dc4b7d8700c" in text and "CC BY 4.0" in text


# --- windows and the token model ----------------------------------------------------------


def test_windows_take_the_traces_in_turn_spread_evenly_over_each() -> None:
    windows = trace.plan_windows(5, {"a": 3600.0, "b": 3000.0}, 120.0, seed=7)
    assert [w.trace for w in windows] == ["a", "b", "a", "b", "a"]
    # a: three windows centred at 1/6, 3/6, 5/6 of its hour; b: two, at 1/4 and 3/4
    assert [w.start + w.length / 2 for w in windows] == [600.0, 750.0, 1800.0, 2250.0, 3000.0]
    assert [w.seed for w in windows] == [7, 8, 9, 10, 11]
    # a window longer than the trace's share stays inside the trace
    wide = trace.plan_windows(2, {"a": 100.0}, 80.0, seed=0)
    assert [(w.start, w.start + w.length) for w in wide] == [(0.0, 80.0), (20.0, 100.0)]


def test_a_draw_is_a_seeded_subset_in_time_order() -> None:
    requests = [Request(float(i), i, 1) for i in range(50)]
    window = Window(0, "a", 10.0, 20.0, 3)
    inside = trace.requests_in(requests, window)
    assert [r.offset for r in inside] == [float(i) for i in range(10, 30)]
    drawn = trace.draw(inside, 5, seed=3)
    assert drawn == trace.draw(inside, 5, seed=3) != trace.draw(inside, 5, seed=4)
    assert len(drawn) == 5 and drawn == sorted(drawn, key=lambda r: r.offset)
    assert set(drawn) <= set(inside)
    assert trace.draw(inside, None, 3) == inside == trace.draw(inside, 99, 3)


def test_kernel_time_follows_the_tokens_and_fills_the_share() -> None:
    window = Window(0, "a", 100.0, 60.0, 0)
    requests = [Request(100.0, 1000, 0), Request(112.0, 0, 100), Request(130.0, 500, 50)]
    jobs = trace.schedule(requests, window, compress=6.0, share=0.4, decode_cost=10.0)
    assert [j.offset for j in jobs] == [0.0, 2.0, 5.0]  # compressed six times
    # units 1000, 1000, 1000: equal kernels, together 40% of the 10 wall seconds
    assert [j.work for j in jobs] == pytest.approx([4 / 3] * 3)
    cheaper = trace.schedule(requests, window, compress=6.0, share=0.4, decode_cost=1.0)
    assert cheaper[0].work > cheaper[2].work > cheaper[1].work  # 1000, 550, 100 units
    assert sum(j.work for j in cheaper) == pytest.approx(4.0, rel=1e-5)
    assert trace.schedule([], window, 6.0, 0.4, 10.0) == []
    assert trace.schedule([Request(100.0, 0, 0)], window, 6.0, 0.4, 10.0)[0].work > 0


def test_the_alone_replay_and_the_deadline_it_gives() -> None:
    jobs = [Job(0.0, 1.0), Job(0.5, 1.0), Job(5.0, 0.2)]
    assert trace.fifo_latencies(jobs) == pytest.approx([1.0, 1.5, 0.2])
    assert trace.deadline_ms(jobs, 2.0, 0.05) == 3000  # 2 x its p99 (1.5 s)
    assert trace.deadline_ms([Job(0.0, 0.0104)], 2.0, 0.05) == 50  # the floor
    assert trace.deadline_ms([Job(0.0, 0.1001)], 1.5, 0.05) == 160  # 150.15 ms rounded up


# --- judging ------------------------------------------------------------------------------


def request(arrival: float, end: float, gpu: tuple[float, float] | None, deadline: float,
            container: str = "s", id: int = 0) -> RequestResult:  # fmt: skip
    g0, g1 = gpu if gpu is not None else (None, None)
    return RequestResult(container, id, arrival, arrival, end, g0, g1, deadline)


def action(t: float, kind: str, container: str = "s", result: str = "ok",
           frozen: float | None = None) -> dict[str, Any]:  # fmt: skip
    record = {"ts": t, "event": "action", "action": kind, "container": container,
              "result": result, "finished": t}  # fmt: skip
    if frozen is not None:
        record["frozen"] = frozen
    return record


def test_spans_merge_and_cover_a_window() -> None:
    assert judge.merged([(3.0, 4.0), (0.0, 1.0), (0.5, 2.0), (2.0, 2.5)]) == [
        (0.0, 2.5), (3.0, 4.0)
    ]  # fmt: skip
    assert judge.covered([(0.0, 2.5), (3.0, 4.0), (1.0, 2.0)], 1.0, 3.5) == pytest.approx(2.0)
    requests = [request(0, 1, (0.0, 1.0), 2), request(1, 3, (1.5, 3.0), 2),
                request(4, 5, None, 2)]  # fmt: skip
    assert judge.busy_share(requests, 0.0, 10.0) == pytest.approx(0.25)
    assert judge.busy_share(requests, 5.0, 5.0) == 0.0


def test_frozen_spans_come_from_the_actuators_pauses_and_unpauses() -> None:
    audit = [
        action(1.0, "pause", frozen=0.99), action(2.0, "unpause"),
        action(2.5, "pause", "other"), action(3.0, "pause", result="failed"),
        {"ts": 3.5, "event": "skip", "container": "s"},
        action(4.0, "pause"), action(4.5, "pause"), action(6.0, "unpause"),
        action(7.0, "pause"),
    ]  # fmt: skip
    spans = judge.frozen_spans(audit, "s", until=9.0)
    assert spans == [(0.99, 2.0), (4.0, 6.0), (7.0, 9.0)]
    late = [request(0.0, 1.5, None, 1.0, id=0), request(2.5, 3.9, None, 1.0, id=1),
            request(5.0, 5.5, None, 1.0, id=2), request(5.5, 8.0, None, 1.0, id=3)]  # fmt: skip
    # missed while frozen, missed between freezes, met, missed while frozen
    assert judge.misses_from_freeze(late, spans) == 2
    # the same schedule shared: the first missed there too (not the freeze's), the last met
    shared = [request(0.0, 1.2, None, 1.0, id=0), request(2.5, 3.0, None, 1.0, id=1),
              request(5.0, 5.5, None, 1.0, id=2), request(5.5, 6.0, None, 1.0, id=3)]  # fmt: skip
    assert judge.misses_from_freeze(late, spans, shared) == 1
    assert judge.misses_from_freeze(late, spans, shared[:3]) == 0  # never answered shared


def test_spreads_take_the_median_and_the_worse_end() -> None:
    assert judge.spread([1.0, None, 3.0, 2.0], higher_is_worse=True) == judge.Spread(2.0, 3.0, 3)
    assert judge.spread([1.0, 3.0, 2.0], higher_is_worse=False).worst == 1.0
    assert judge.spread([None], True) == judge.Spread(None, None, 0)
    assert judge.ratio(3.0, 2.0) == 1.5 and judge.ratio(1.0, 0.0) is None
    assert judge.ratio(None, 1.0) is None


# --- the bench's plan and its judging -----------------------------------------------------


def toy_traces() -> dict[str, list[Request]]:
    return {
        "conv": [Request(float(t), 100 + t, 10) for t in range(0, 600, 2)],
        "code": [Request(float(t), 2000, 5) for t in range(1, 600, 3)],
    }


def test_a_pair_replays_both_traces_with_their_own_deadlines() -> None:
    pair = traces.kind_named("pair")
    window = Window(1, "code", 200.0, 96.0, 5)
    planned = traces.plan(pair, window, toy_traces(), wall_s=16.0)
    tight, loose = planned.servers
    assert (tight.role, tight.trace, loose.role, loose.trace) == ("tight", "code", "loose", "conv")
    assert len(tight.jobs) == 16 and len(loose.jobs) == round(0.6 * 16)
    for server, factor in ((tight, 1.5), (loose, 3.0)):
        assert server.deadline_ms == trace.deadline_ms(server.jobs, factor, 0.05)
    assert sum(j.work for j in tight.jobs) == pytest.approx(0.26 * 16, rel=1e-4)
    dense = traces.plan(traces.kind_named("dense"), window, toy_traces(), 16.0)
    assert len(dense.servers[0].jobs) == len(
        trace.requests_in(toy_traces()["code"], Window(1, "code", 200.0, 96.0, 5))
    )
    oneshot = traces.plan(traces.kind_named("d"), window, toy_traces(), 16.0)
    assert oneshot.servers[0].deadline_ms == 2000  # fixed, whatever its p99 alone
    assert oneshot.oneshot_s == pytest.approx(0.4 * 16)


@pytest.mark.parametrize("quick", [True, False])
def test_each_run_puts_its_containers_on_gpus_the_node_has(tmp_path: Path, quick: bool) -> None:
    sizes = traces.SIZES["quick" if quick else "full"]
    for kind in traces.KINDS:
        plans = [traces.plan(kind, w, toy_traces(), sizes.wall_s)
                 for w in trace.plan_windows(sizes.parallel, {"conv": 590.0, "code": 590.0},
                                             sizes.wall_s * kind.compress, 1)]  # fmt: skip
        runs = list(traces.run_casts(plans, lambda label: replay(tmp_path, label),
                                     sizes.alone_beside, ("probe", "nvml")))  # fmt: skip
        assert [label.rsplit("-", 1)[1] for label, _, _ in runs] == [arm for _, arm, _ in runs]
        assert [arm for _, arm, _ in runs] == (
            ["shared", "probe", "nvml"] if quick else ["alone", "shared", "probe", "nvml"]
        )
        every = {}
        for _label, _arm, cast in runs:
            gpus: dict[str, set[str]] = {}
            for spec in cast.specs:
                device = spec.kind_args[spec.kind_args.index("--device") + 1]
                assert int(device) < traces.devices_needed(sizes)
                window, arm, _role = cast.who[spec.name]
                gpus.setdefault(device, set()).add(f"{window}/{arm}")
                assert spec.managed == (arm in traces.MANAGED)
                every[cast.who[spec.name]] = spec
            # a GPU holds one window's containers of one arm; alone: one container each
            assert all(len(owners) == 1 for owners in gpus.values())
        roles = {s.role for s in plans[0].servers} | ({"trainer"} if kind.trainer else set())
        roles |= {"oneshot"} if kind.oneshot else set()
        for p in plans:
            for arm in traces.ARMS:
                for role in roles - ({"trainer"} if arm == "alone" else set()):
                    assert (p.window.index, arm, role) in every
        assert ((None, "alone", "trainer") in every) == kind.trainer


def replay(tmp_path: Path, label: str) -> traces.Replay:
    return traces.Replay(tmp_path / label, time_scale=0.1, wall_s=16.0)


def test_the_server_replays_its_schedule_with_its_deadline(tmp_path: Path) -> None:
    server = traces.ServerPlan("server", "conv", (Job(0.5, 0.2), Job(1.0, 0.05)), 420)
    spec = replay(tmp_path, "run").server("a-shared-w0-server", server, "2", managed=True)
    assert spec.deadline == "420ms" and spec.managed and spec.kind_args[-2:] == ("--device", "2")
    path = Path(spec.kind_args[spec.kind_args.index("--trace") + 1])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # each request copies its token ids in and out: calls the probe sees, as a server's are
    assert lines == [{"t": 0.5, "work": 2.0, "bytes": 4096}, {"t": 1.0, "work": 0.5, "bytes": 4096}]
    assert spec.kind_args[spec.kind_args.index("--io-bytes") + 1] == "4096"
    shot = replay(tmp_path, "run").oneshot("a-alone-w0-oneshot", 6.4, "1", managed=False)
    assert shot.work_seconds == 64.0 and shot.deadline == "12800ms"
    assert shot.delay_s == 0.25 * 16 and shot.kind_args[:2] == ("--kernels", "64")


def fake_record(label: str, who: dict[str, tuple[int | None, str, str]], released: float,
                requests: list[RequestResult], steps: list[StepResult],
                audit: list[dict[str, Any]]) -> traces.RunRecord:  # fmt: skip
    cast = traces.Cast(who=who)
    result = ScenarioResult(label, released, (), (), tuple(requests), tuple(steps))
    return traces.RunRecord(label, cast, result, audit)


def test_a_window_is_judged_against_alone_and_the_ideal() -> None:
    sparse = traces.kind_named("sparse")
    server = traces.ServerPlan("server", "conv", (Job(0, 1),), 1000)
    planned = traces.WindowPlan(sparse, Window(0, "conv", 0.0, 60.0, 0), (server,))

    def served(name: str, latencies: list[float], busy: float) -> list[RequestResult]:
        out = []
        for i, latency in enumerate(latencies):
            gpu = (100.0 + i, 100.0 + i + busy / len(latencies))
            out.append(RequestResult(name, i, 100.0 + i, 100.0 + i, 100.0 + i + latency,
                                     *gpu, 1.0))  # fmt: skip
        return out

    def trained(name: str, per_s: float) -> list[StepResult]:
        return [StepResult(name, i, 100.0, 100.0 + (i + 1) / per_s) for i in range(int(10 * per_s))]

    alone = fake_record(
        "b-shared", {"x-alone-server": (0, "alone", "server"),
                     "x-alone-trainer": (None, "alone", "trainer"),
                     "x-shared-server": (0, "shared", "server"),
                     "x-shared-trainer": (0, "shared", "trainer")}, 100.0,
        served("x-alone-server", [0.2] * 9 + [0.5], 4.0)
        + served("x-shared-server", [0.4] * 9 + [1.5], 4.0),
        trained("x-alone-trainer", 20.0) + trained("x-shared-trainer", 15.0), [],
    )  # fmt: skip
    probe = fake_record(
        "b-probe", {"x-probe-server": (0, "probe", "server"),
                    "x-probe-trainer": (0, "probe", "trainer")}, 100.0,
        served("x-probe-server", [0.2] * 9 + [0.6], 4.0), trained("x-probe-trainer", 6.0),
        [action(101.0, "pause", "x-probe-trainer"),
         action(106.0, "unpause", "x-probe-trainer")],
    )  # fmt: skip
    nvml = fake_record(
        "b-nvml", {"x-nvml-server": (0, "nvml", "server"),
                   "x-nvml-trainer": (0, "nvml", "trainer")}, 100.0,
        served("x-nvml-server", [0.2] * 9 + [1.0], 4.0), trained("x-nvml-trainer", 3.0),
        [action(101.0, "pause", "x-nvml-trainer"),
         action(109.0, "unpause", "x-nvml-trainer")],
    )  # fmt: skip
    seen = traces.index([alone, probe, nvml])
    got = traces.judge_window(planned, seen, wall_s=10.0)
    assert got["server"]["p99_alone_ms"] == 500.0 and got["server"]["hit_rate_shared"] == 0.9
    assert got["rt_p99_over_alone_shared"] == 3.0 and got["rt_p99_over_alone_probe"] == 1.2
    assert got["rt_p99_over_alone_nvml"] == 2.0
    assert got["rt_hit_rate_probe"] == 1.0 and got["rt_hit_rate_nvml"] == 1.0
    assert got["rt_share_alone"] == pytest.approx(0.4) and got["be_steps_alone"] == 20.0
    assert got["be_ideal"] == pytest.approx(12.0)  # 20 steps/s x (1 - 0.4)
    assert got["be_over_ideal_shared"] == 1.25 and got["be_over_ideal_probe"] == 0.5
    assert got["be_over_ideal_nvml"] == 0.25
    assert got["be_frozen_share_probe"] == 0.5 and got["be_frozen_share_nvml"] == 0.8
    line = traces.headline({"sparse": traces.spreads([got])}, {"sparse": [got]}, True)
    # the probe's figures keep their names; the NVML-only ones add _nvml
    assert line["sparse_rt_p99_over_alone_worst"] == 1.2
    assert line["sparse_rt_p99_over_alone_worst_nvml"] == 2.0
    assert line["sparse_be_over_ideal_worst"] == 0.5
    assert line["sparse_be_over_ideal_worst_nvml"] == 0.25
    assert line["dense_rt_p99_over_alone_worst"] is None
    assert line["dense_rt_p99_over_alone_worst_nvml"] is None
    assert line["oneshot_server_misses_from_freeze"] is None
    assert line["oneshot_server_misses_from_freeze_nvml"] is None
    assert line["probe_attached"] is True
    picture = traces.points({"sparse": [got]})["sparse"]
    assert {(r["arm"], r["be_steps_per_s"]) for r in picture["windows"]} == {
        ("shared", 15.0), ("nvml", 3.0), ("probe", 6.0), ("ideal", 12.0)
    }  # fmt: skip
    assert picture["median"]["ideal"]["rt_p99_over_alone"] == 1.0
    assert picture["median"]["nvml"]["rt_p99_over_alone"] == 2.0


def test_the_last_line_names_each_figure_for_both_arms_and_whether_the_probe_attached() -> None:
    """Every key the probe's arm has, the NVML-only arm has with ``_nvml`` after it; a probe
    that never ran or failed to attach is ``probe_attached: false``, never missing."""
    oneshot = [
        {"server_misses_from_freeze_probe": 1, "server_misses_from_freeze_nvml": 3},
        {"server_misses_from_freeze_probe": 0, "server_misses_from_freeze_nvml": 2},
    ]
    pair = {"hit_rate_probe_minus_shared": judge.Spread(0.0, -0.1, 2),
            "hit_rate_nvml_minus_shared": judge.Spread(-0.1, -0.3, 2),
            "tight_hit_rate_probe_minus_shared": judge.Spread(0.1, 0.05, 2),
            "tight_hit_rate_nvml_minus_shared": judge.Spread(0.0, 0.0, 2)}  # fmt: skip
    for attached in (None, False):
        line = traces.headline({"pair": pair}, {"oneshot": oneshot}, attached)
        assert line["probe_attached"] is False
    line = traces.headline({"pair": pair}, {"oneshot": oneshot}, True)
    probe_keys = [k for k in line if k != "probe_attached" and not k.endswith("_nvml")]
    assert sorted(line) == sorted([*probe_keys, *(k + "_nvml" for k in probe_keys),
                                   "probe_attached"])  # fmt: skip
    assert line["pair_hit_rate_managed_minus_shared_worst"] == -0.1
    assert line["pair_hit_rate_managed_minus_shared_worst_nvml"] == -0.3
    assert line["pair_tight_hit_rate_managed_minus_shared_worst"] == 0.05
    assert line["oneshot_server_misses_from_freeze"] == 1
    assert line["oneshot_server_misses_from_freeze_nvml"] == 5


def test_the_exporter_runs_with_the_probe_each_arm_asks_for() -> None:
    flags = ["--trust.all", "--probe.launch=off"]
    assert traces.exporter_flags(flags, "probe") == ["--trust.all", "--probe.launch=auto"]
    assert traces.exporter_flags(flags, "nvml") == ["--trust.all", "--probe.launch=off"]
    # each batch begins with the arm the exporter already runs for, so it restarts once
    assert traces.managed_order("nvml") == ("nvml", "probe")
    assert traces.managed_order("probe") == ("probe", "nvml")


@pytest.mark.parametrize(
    ("metrics", "up", "reason"),
    [
        ('gpuguard_exporter_launch_probe_up{node="bench",reason=""} 1.0\n', True, ""),
        ('# HELP x\ngpuguard_exporter_launch_probe_up{node="n",reason="no_permission"} 0.0\n',
         False, "no_permission"),
        ("gpuguard_exporter_build_info{} 1\n", False, "the exporter reports no launch probe"),
        ("", False, "the exporter reports no launch probe"),
    ],
)  # fmt: skip
def test_whether_the_probe_attached_is_read_from_the_exporter(
    metrics: str, up: bool, reason: str
) -> None:
    assert traces.probe_up(metrics) == (up, reason)


class FakeNode:
    """What ``ProbeSwitch`` touches of a ``NodeStack``: the order of restarts, the flags."""

    def __init__(self) -> None:
        self.exporter: Any = self
        self.extra_exporter_flags = ["--probe.launch=off"]
        self.exporter_url = "http://127.0.0.1:1"
        self.calls: list[str] = []

    def stop(self) -> None:
        self.calls.append("stop exporter")

    def stop_actuator(self) -> None:
        self.calls.append("stop actuator")

    def start_exporter(self) -> None:
        self.calls.append(f"start exporter {self.extra_exporter_flags[-1]}")
        self.exporter = self

    def start_actuator(self) -> None:
        self.calls.append("start actuator")


def test_the_switch_restarts_the_exporter_only_when_the_arm_changes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = iter(['gpuguard_exporter_launch_probe_up{reason=""} 1',
                    'gpuguard_exporter_launch_probe_up{reason="no_binary"} 0'])  # fmt: skip
    monkeypatch.setattr(traces, "scrape", lambda url: next(answers))
    node = FakeNode()
    switch = traces.ProbeSwitch(node)  # type: ignore[arg-type]
    for arm in ("shared", "alone", "nvml"):
        switch.use(arm)
    assert node.calls == [] and switch.attached is None
    switch.use("probe")
    assert node.calls == ["stop actuator", "stop exporter", "start exporter --probe.launch=auto",
                          "start actuator"]  # fmt: skip
    assert switch.attached is True and capsys.readouterr().out == ""
    switch.use("nvml")
    assert node.calls[-2] == "start exporter --probe.launch=off"
    switch.use("probe")  # this time it cannot attach: one line, and false from then on
    assert switch.attached is False and switch.reasons == ["no_binary"]
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "NOT attached (no_binary)" in said[0]


# --- the command line ---------------------------------------------------------------------


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / "traces.py"), *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_help_names_the_scenarios_and_the_actuator_flags() -> None:
    out = run_bench("--help")
    assert out.returncode == 0, out.stderr
    for word in ("--quick", "--actuator-arg", "--trace-dir", "--points", "--plan", "sparse",
                 "dense", "pair", "oneshot"):  # fmt: skip
        assert word in out.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--windows", "0"], "--windows: must be an integer >= 1, got '0'"),
        (["--only", "nosuch"], "unknown scenario 'nosuch': one of sparse (a)"),
        (["--window-s", "-3"], "--window-s: must be > 0"),
        (["--window", "x"], "--window: invalid int value: 'x'"),
    ],
)
def test_a_bad_argument_is_one_line(args: list[str], said: str) -> None:
    out = run_bench(*args)
    assert out.returncode == 2 and out.stdout == ""
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and said in errors[0] and out.stderr.strip().endswith(errors[0])


def test_a_window_the_plan_does_not_have_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        traces.main(["--quick", "--window", "3", "--plan", "--synthetic"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err == "bench/traces.py: error: --window 3: the plan has windows 0 to 2\n"


def test_missing_or_altered_subsets_are_one_line_and_nothing_runs(tmp_path: Path) -> None:
    out = run_bench("--plan", "--trace-dir", str(tmp_path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("bench/traces.py: error: the trace subsets")
    assert len(out.stderr.strip().splitlines()) == 1
    for t in trace.TRACE_FILES:
        write_trace(tmp_path / t.file, [(0.0, 1, 1)])
    out = run_bench("--plan", "--trace-dir", str(tmp_path))
    assert out.returncode == 2 and "not the subset bench/traces/README.md describes" in out.stderr


def test_plan_prints_every_windows_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    files = []
    for t, step in zip(("conv", "code"), (0.5, 1.5), strict=True):
        rows = [(i * step, 500, 20) for i in range(int(3600 / step))]
        digest = write_trace(tmp_path / f"{t}.csv", rows)
        files.append(TraceFile(t, f"{t}.csv", digest, len(rows)))
    monkeypatch.setattr(trace, "TRACE_FILES", tuple(files))
    assert traces.main(["--quick", "--plan", "--trace-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("  w0 conv trace") == 4
    # every request as it came, and the one-shot's server: the steady trace alone
    assert out.count("  w1 code trace") == 2 and out.count("  w1 conv trace") == 2
    assert "(sparse)" in out and "(oneshot)" in out and "one-shot 6.4 s of kernels" in out
    assert "server  conv     24 requests" in out  # 1.5 a second for 16 s
    assert traces.main(["--quick", "--plan", "--trace-dir", str(tmp_path), "--window", "1",
                        "--only", "pair"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "  w1 code trace" in out and "  w0 " not in out and "  w2 " not in out


def test_a_window_without_requests_is_refused_before_anything_runs() -> None:
    quiet = {"conv": [Request(0.0, 10, 1), Request(500.0, 10, 1)], "code": toy_traces()["code"]}
    with pytest.raises(TraceError, match=r"sparse w0: no request in conv from 100 s for 96 s"):
        traces.plan(traces.kind_named("sparse"), Window(0, "conv", 100.0, 96.0, 1), quiet, 16.0)


def test_a_pair_is_judged_by_its_worse_server() -> None:
    pair = traces.kind_named("pair")
    servers = (traces.ServerPlan("tight", "conv", (Job(0, 1),), 1000),
               traces.ServerPlan("loose", "code", (Job(0, 1),), 1000))  # fmt: skip
    planned = traces.WindowPlan(pair, Window(0, "conv", 0.0, 60.0, 0), servers)
    # latencies per (arm, role): the tight server suffers when shared, the loose one managed
    latencies = {("alone", "tight"): [0.5, 0.5], ("alone", "loose"): [0.5, 0.5],
                 ("shared", "tight"): [0.5, 2.0], ("shared", "loose"): [0.5, 0.5],
                 ("probe", "tight"): [0.5, 0.5], ("probe", "loose"): [1.5, 0.75],
                 ("nvml", "tight"): [0.5, 2.0], ("nvml", "loose"): [0.5, 0.5]}  # fmt: skip
    who, requests = {}, []
    for (arm, role), values in latencies.items():
        name = f"c-{arm}-{role}"
        who[name] = (0, arm, role)
        requests += [RequestResult(name, i, 1.0, 1.0, 1.0 + v, None, None, 1.0)
                     for i, v in enumerate(values)]  # fmt: skip
    got = traces.judge_window(planned, traces.index([fake_record("c", who, 0.0, requests, [], [])]),
                              wall_s=10.0)  # fmt: skip
    assert got["tight"]["hit_rate_shared"] == 0.5 and got["loose"]["hit_rate_probe"] == 0.5
    assert got["rt_hit_rate_shared"] == 0.5 and got["rt_hit_rate_probe"] == 0.5
    assert got["rt_p99_over_alone_shared"] == 4.0 and got["rt_p99_over_alone_probe"] == 3.0
    # the loose server lost half its hits to management: the pair's key; the tight one gained
    assert got["hit_rate_probe_minus_shared"] == -0.5
    assert got["tight_hit_rate_probe_minus_shared"] == 0.5
    # NVML-only: each server as if shared
    assert got["hit_rate_nvml_minus_shared"] == 0.0
    assert got["tight_hit_rate_nvml_minus_shared"] == 0.0


def test_the_synthetic_stand_in_is_seeded_and_shaped_like_the_subsets() -> None:
    """Without the production subsets (kept out of commits) the bench runs on a stand-in:
    the same trace names, an hour each, time-ordered, at about the subsets' rates."""
    first, again = trace.synthetic_traces(7), trace.synthetic_traces(7)
    assert first == again and first != trace.synthetic_traces(8)
    assert set(first) == {t.name for t in trace.TRACE_FILES}
    for name, rows in {t.name: t.rows for t in trace.TRACE_FILES}.items():
        requests = first[name]
        offsets = [r.offset for r in requests]
        assert offsets == sorted(offsets) and 3500 < offsets[-1] <= 3600
        assert 0.8 * rows < len(requests) < 1.2 * rows
        assert all(r.context >= 1 and r.generated >= 1 for r in requests)


def test_plan_runs_on_the_synthetic_stand_in(capsys: pytest.CaptureFixture[str]) -> None:
    assert traces.main(["--quick", "--plan", "--synthetic", "--trace-dir", "/nonexistent"]) == 0
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out and "(sparse)" in out and "(oneshot)" in out


def test_the_picture_has_a_point_per_window_and_arm(tmp_path: Path) -> None:
    from replay import picture

    doc = {
        "actuator_args": ["--policy.best-effort-control=rate"],
        "probe_attached": False,
        "points": {
            "sparse": {"windows": [
                {"window": 0, "arm": "shared", "rt_p99_over_alone": 2.5, "be_over_ideal": 1.0},
                {"window": 0, "arm": "nvml", "rt_p99_over_alone": 1.3, "be_over_ideal": 0.5},
                {"window": 0, "arm": "probe", "rt_p99_over_alone": 1.1, "be_over_ideal": 0.6},
                {"window": 0, "arm": "ideal", "rt_p99_over_alone": 1.0, "be_over_ideal": 1.0},
                {"window": 1, "arm": "probe", "rt_p99_over_alone": None, "be_over_ideal": 0.5},
            ]},
        },
    }  # fmt: skip
    points = tmp_path / "points.json"
    points.write_text(json.dumps(doc))
    assert picture.series(doc, "sparse") == {
        "shared": [(1.0, 2.5)],
        "nvml": [(0.5, 1.3)],
        "probe": [(0.6, 1.1)],
        "ideal": [(1.0, 1.0)],
    }
    label = picture.label_of(doc, points)
    assert label == "policy.best-effort-control=rate"
    # a probe that did not attach is never drawn as the probe
    assert picture.arm_label(doc, "probe", label) == (
        "launch probe (NOT attached: NVML only): policy.best-effort-control=rate"
    )
    assert picture.arm_label({**doc, "probe_attached": True}, "probe", "r") == "launch probe: r"
    assert picture.arm_label(doc, "nvml", "r") == "NVML only: r"
    assert picture.arm_label(doc, "ideal", "r") == "ideal"
    assert picture.main([str(points), "--out", str(tmp_path / "img")]) == 0
    made = tmp_path / "img" / "traces-sparse.png"
    assert made.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "img" / "traces-dense.png").exists()  # no points, no picture
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    with pytest.raises(SystemExit) as caught:
        picture.main([str(bad)])
    assert caught.value.code == 2
