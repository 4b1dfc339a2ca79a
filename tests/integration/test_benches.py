"""Every benchmark runs in CI: each ``bench/*.py`` with its shortest flag ends with one JSON
line holding the figures docs/benchmarks.md quotes for it (issue 19 item 3).

Only the shape is checked, never a figure: performance is the benchmarks' business, and
these runs are too short to mean anything. What this catches is a bench that no longer runs
(``bench/placement.py`` crashed once a ``TaskView`` field was added, and
``bench/alert_pipeline.py`` waited for a pause that burst mode never asked for) or that lost
a figure docs/benchmarks.md quotes. ``bench/realtime.py --smoke`` runs in ``test_realtime_bench.py``
and ``bench/gpu_truth.py --quick`` in ``test_gpu_truth.py``.

On this project's 2-core machine all of these take about 11 minutes one after another,
``traces.py --quick`` about 5 of them (on the production subsets where ``shared/traces`` holds
them, else on the synthetic stand-in, saying why); ``make test`` runs them two at a time (they
mostly wait on their services, so neither slows the other much).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.prereq import require_binary, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.standalone]

REPO = Path(__file__).resolve().parents[2]
ELSEWHERE = {"realtime.py": "test_realtime_bench.py", "gpu_truth.py": "test_gpu_truth.py"}


@dataclass(frozen=True)
class Bench:
    script: str
    flags: tuple[str, ...]
    keys: tuple[str, ...]
    dockerd: bool = True  # a private dockerd (root)
    alerting: bool = False  # Prometheus and Alertmanager
    traces: bool = False  # the production trace subsets (bench/traces/README.md)
    probe: bool = False  # the launch probe's uprobes (root: CAP_BPF + CAP_PERFMON)
    timeout_s: float = 240.0

    @property
    def id(self) -> str:
        return " ".join((self.script, *self.flags))


#: traces.py's figures with the launch probe; the NVML-only arm's add ``_nvml``
TRACES_KEYS = (
    "sparse_rt_p99_over_alone_worst", "sparse_be_over_ideal_worst",
    "dense_rt_p99_over_alone_worst", "dense_be_over_ideal_worst",
    "pair_hit_rate_managed_minus_shared_worst", "pair_tight_hit_rate_managed_minus_shared_worst",
    "oneshot_server_misses_from_freeze",
)  # fmt: skip

BENCHES = (
    # the longest first: two at a time, the other worker runs all the rest meanwhile
    Bench("traces.py", ("--quick", "--points", str(Path(tempfile.gettempdir()) /
                                                    "gpuguard-traces-points.json")), (
        *TRACES_KEYS, *(key + "_nvml" for key in TRACES_KEYS), "probe_attached",
    ), traces=True, timeout_s=540.0),
    Bench("placement.py", ("--quick",), (
        "rank_ms_10", "rank_ms_100", "rank_ms_1000", "rank_only_ms_1000",
        "hit_rate_gpuguard", "fig3_hit_rate_gpuguard", "fig4_hit_rate_gpuguard",
        "hit_rate_gpuguard_no_runtime", "hit_rate_random", "hit_rate_least_loaded",
        "hit_rate_paper_c", "extender_pod_ms_1900", "extender_queries_per_pod_1900",
    ), dockerd=False),
    Bench("contention_model.py", ("--quick",), ("max_rel_error", "time_scale", "profile"),
          dockerd=False),
    Bench("exporter_cost.py", ("--quick",), (
        "poll_ms_100", "poll_ms_1000", "algorithm1_poll_ms_100", "render_ms_1000",
        "render_first_ms_1000", "render_generic_ms_1000", "rss_mb", "idle_cpu_pct",
    )),
    Bench("detection_accuracy.py", ("--smoke",), (
        "start_err_mean_s", "end_err_mean_s", "runtime_err_mean_s", "start_err_abs_mean_s",
        "end_err_abs_mean_s", "runtime_err_abs_mean_s", "burst_start_err_mean_s",
        "burst_end_err_mean_s", "gap_4ms_joined", "gap_50ms_merged", "gap_600ms_own",
    )),
    Bench("contention.py", ("--quick",), (
        "unmanaged_total_s", "managed_total_s", "ideal_sequential_s", "mean_completion_gain",
        "edf_hit_rate", "fifo_hit_rate", "unmanaged_hit_rate", "pause_latency_p95_ms",
        "pause_latency_staggered_p95_ms",
    )),
    Bench("contention.py", ("--quick", "--light"), (
        "light_headroom_total_s", "light_headroom_mean_completion_s",
        "light_one_at_a_time_total_s", "light_one_at_a_time_mean_completion_s",
        "light_unmanaged_total_s", "light_unmanaged_mean_completion_s",
    )),
    Bench("freeze.py", ("--smoke",), (
        "freeze_p50_ms_burst10", "freeze_p95_ms_burst10", "freeze_docker_in_line_p95_ms_burst10",
        "docker_pause_p50_ms_burst10", "docker_pause_p95_ms_burst10",
    )),
    Bench("edgefreeze.py", ("--quick",), (
        "edge_freeze_p95_ms_1", "edge_freeze_p95_ms_10", "edge_freeze_p50_ms_1",
        "edge_freeze_p50_ms_10", "edge_published_split_p50_ms_1",
        "published_started_split_p50_ms_1", "started_frozen_split_p50_ms_1", "probe_attached",
    ), probe=True),
    Bench("colocation.py", ("--quick",), (
        "rt_p99_alone_ms", "rt_p99_shared_ms", "rt_p99_managed_ms", "rt_hit_rate_shared",
        "rt_hit_rate_managed", "be_steps_per_s_alone", "be_steps_per_s_managed",
        "be_share_of_solo", "freeze_latency_median_ms", "thaw_latency_median_ms",
    )),
    Bench("node_marks.py", ("--smoke",), ("node_marked_fraction", "server_hit_rate"),
          alerting=True),
    Bench("alert_pipeline.py", ("--smoke",), ("alert_pipeline_p50_s", "alert_pipeline_max_s"),
          alerting=True),
    Bench("faults.py", ("--quick",), (
        "late_duplicate_listen_s", "late_duplicate_resumed", "late_duplicate_stale_skips",
        "late_duplicate_failing_open", "hung_dockerd_listen_s", "hung_dockerd_engine_calls",
        "hung_dockerd_both_alive", "gone1000_listen_s", "gone1000_settled_s",
    )),
    Bench("launchprobe.py", ("--quick",), (
        "probe_attached", "probe_ns_per_call", "loop_slowdown_10k", "loop_slowdown_100k",
        "exporter_cpu_share", "task_error_ms_p99", "verdicts_agree", "scenes_verdicts_agree",
    ), probe=True),
    Bench("http_load.py", ("--quick",), (
        "burst300_p99_s", "burst300_actuator_p99_s", "burst300_failed", "webhook_under_siege_ms",
        "followers1000_event_p50_s", "followers1000_event_p99_s", "followers1000_threads_before",
        "followers1000_threads_waiting", "followers1000_rss_growth_mb",
        "unauth_4mib_rss_growth_mb", "unauth_4mib_401",
    )),
)  # fmt: skip


def test_every_bench_is_run_somewhere() -> None:
    scripts = {p.name for p in (REPO / "bench").glob("*.py")}
    assert scripts == {b.script for b in BENCHES} | set(ELSEWHERE)


@pytest.mark.parametrize("bench", BENCHES, ids=[b.id for b in BENCHES])
def test_bench_ends_with_the_figures_the_readme_quotes(bench: Bench) -> None:
    if bench.dockerd:
        require_binary("dockerd")
        if os.geteuid() != 0:
            unavailable("the benchmark's private dockerd needs root")
    if bench.probe and os.geteuid() != 0:
        unavailable("the launch probe's uprobes need root (CAP_BPF + CAP_PERFMON)")
    if bench.alerting:
        for binary in ("prometheus", "prometheus-alertmanager"):
            require_binary(binary)
    flags = list(bench.flags)
    if bench.traces:
        flags += traces_or_synthetic()
    out, err, status = _run([sys.executable, str(REPO / "bench" / bench.script), *flags],
                            bench.timeout_s)  # fmt: skip
    assert status == 0, out[-3000:] + err[-3000:]
    line = json.loads(out.strip().splitlines()[-1])
    missing = [key for key in bench.keys if line.get(key) is None]
    assert not missing, (missing, line)
    if bench.traces:
        # a probe arm whose probe did not attach says so, once, and is never labelled as one
        assert isinstance(line["probe_attached"], bool), line
        said = [x for x in out.splitlines() if "the launch probe is NOT attached" in x]
        assert len(said) == (0 if line["probe_attached"] else 1), said
        assert line["traces"] == ("azure-llm-2023" if "--synthetic" not in flags else "synthetic")


def test_traces_bench_says_in_one_line_which_actuator_flag_was_refused() -> None:
    """``--actuator-arg`` reaches the actuator unchanged: a value it refuses stops the bench
    with the actuator's own words, and the stack it began is stopped."""
    require_binary("dockerd")
    if os.geteuid() != 0:
        unavailable("the benchmark's private dockerd needs root")
    argv = [sys.executable, str(REPO / "bench" / "traces.py"), "--quick", "--windows", "1",
            "--actuator-arg=--besteffort.floor=2", *traces_or_synthetic()]  # fmt: skip
    out, err, status = _run(argv, 120)
    assert status == 2, out[-2000:] + err[-2000:]
    assert err.strip().splitlines() == [
        "bench/traces.py: error: the stack did not start: actuator exited early: gpuguard "
        "actuator: --besteffort.floor '2': must be in [0, 1)"
    ]
    base = next(line for line in out.splitlines() if "dockerd at unix://" in line)
    directory = Path(base.split("unix://", 1)[1]).parents[1]
    assert not directory.exists()  # removed, with everything that ran from it


def test_a_bench_stopped_by_sigterm_stops_every_process_it_started() -> None:
    """A timeout or ``kill`` sends SIGTERM, not Ctrl-C: the bench unwinds as for Ctrl-C, its
    ``finally`` stopping its dockerd, gpusim, exporter, actuator and guard and removing its
    containers, and exits 143."""
    require_binary("dockerd")
    if os.geteuid() != 0:
        unavailable("the benchmark's private dockerd needs root")
    argv = [sys.executable, str(REPO / "bench" / "traces.py"), "--quick", "--windows", "1",
            "--synthetic"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen: list[str] = []
    directory: Path | None = None
    try:
        for line in proc.stdout:  # the whole stack is up once the actuator is
            seen.append(line)
            if "dockerd at unix://" in line:
                directory = Path(line.split("unix://", 1)[1].strip()).parents[1]
            if "actuator at http" in line and directory is not None:
                break
        assert directory is not None, "".join(seen[-30:])
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(directory) in text:
            left.append(text)
            with contextlib.suppress(OSError):  # the test leaves nothing behind either way
                os.kill(int(cmdline.parent.name), signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen[-20:]) + rest[-3000:]
    assert not left, left
    assert not directory.exists(), rest[-3000:]  # removed, with everything that ran from it


def traces_or_synthetic() -> list[str]:
    """No flag where the production subsets are found (bench/traces, or a shared/traces in,
    beside or beside the main checkout of this one: CI copies ``shared/`` beside its clone);
    else ``--synthetic``, printing why. The traces are data kept out of the project's commits
    (the workplace's rule for fetched data): bench/traces/README.md names each file and its
    sha256. The stand-in runs the bench end to end and says nothing about production."""
    sys.path.insert(0, str(REPO / "bench"))
    from replay.trace import TraceError, find_trace_dir, trace_dirs

    try:
        find_trace_dir(trace_dirs(REPO))
    except TraceError as exc:
        print(f"traces.py runs --synthetic: {exc}")
        return ["--synthetic"]
    return []


def _run(argv: list[str], timeout_s: float) -> tuple[str, str, int]:
    """Run a bench; past the timeout, interrupt it (its ``finally`` stops every process it
    started and removes its containers) before killing it."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"{argv[1]} ran past {timeout_s:g}s:\n{out[-3000:]}{err[-3000:]}")
    return out, err, proc.returncode
