"""The workload kinds (oneshot, server, train) on an in-process gpusim, and their CLI."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.gpusim.client import GpusimClient
from gpuguard.gpusim.config import DaemonConfig, DeviceSpec
from gpuguard.gpusim.daemon import Daemon
from gpuguard.gpusim.workload import main
from gpuguard.gpusim.workload.arrivals import parse_trace, rate_arrivals
from gpuguard.gpusim.workload.server import percentile
from tests.waiting import wait_for

SCALE = 0.05
GIB = 2**30


@pytest.fixture
def daemon(serve_gpusim: Callable[[DaemonConfig], Daemon]) -> Daemon:
    config = DaemonConfig(
        devices=(DeviceSpec(0, "a", 8 * GIB), DeviceSpec(1, "b", 8 * GIB)),
        time_scale=SCALE,
        copy_time_scale=SCALE,
        context_memory_bytes=100 * 2**20,
        sample_period_s=0.05,
    )
    return serve_gpusim(config)


def run(daemon: Daemon, tmp_path: Path, *argv: str) -> list[dict[str, Any]]:
    """Run the workload in this process; its log lines."""
    log = tmp_path / "w.log"
    assert main([*argv, "--socket", str(daemon.socket_path), "--log", str(log)]) == 0
    return [json.loads(line) for line in log.read_text().splitlines()]


def of(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def test_server_answers_requests_at_a_fixed_rate(daemon: Daemon, tmp_path: Path) -> None:
    argv = ["server", "--rate", "20", "--arrivals", "fixed", "--requests", "8"]
    events = run(daemon, tmp_path, *argv, "--request-work", "0.4", "--io-bytes", "1MiB")
    assert [e["event"] for e in events] == ["ready"] + ["request"] * 8 + ["summary"]
    requests = of(events, "request")
    origin = requests[0]["arrival"]
    for i, req in enumerate(requests):
        assert req["id"] == i and req["kind"] == "server" and req["pid"] == os.getpid()
        assert req["arrival"] == pytest.approx(origin + i / 20, abs=1e-6)
        assert req["arrival"] <= req["start"] < req["gpu_start"] < req["gpu_end"] < req["end"]
        assert req["end"] == req["t"]
        # 0.4 s of kernels at time scale 0.05: 20 ms of GPU time, between the copies.
        assert req["gpu_end"] - req["gpu_start"] == pytest.approx(0.4 * SCALE, abs=0.002)
    summary = events[-1]
    assert summary["requests"] == 8
    assert 0.4 * SCALE <= summary["latency_p50_s"] <= summary["latency_p99_s"] < 1.0


def test_server_follows_a_trace(daemon: Daemon, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"t": 0}\n{"t": 0.2, "work": 1.0, "bytes": 0}\n\n{"t": 0.25}\n')
    events = run(daemon, tmp_path, "server", "--trace", str(trace), "--request-work", "0.2")
    requests = of(events, "request")
    assert [(r["work"], r["bytes"]) for r in requests] == [(0.2, 262144), (1.0, 0), (0.2, 262144)]
    assert requests[1]["arrival"] - requests[0]["arrival"] == pytest.approx(0.2, abs=1e-6)
    assert requests[1]["end"] - requests[1]["start"] >= 1.0 * SCALE


def test_train_logs_each_step_when_the_device_finished_it(daemon: Daemon, tmp_path: Path) -> None:
    argv = ["train", "--steps", "12", "--sync-every", "4", "--step-work", "0.4"]
    events = run(daemon, tmp_path, *argv, "--kernels", "2")
    steps, syncs = of(events, "step"), of(events, "sync")
    assert [s["step"] for s in steps] == list(range(12))
    assert [s["steps"] for s in syncs] == [4, 8, 12]
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(steps)]
    # Steps run back to back on the device: 0.4 s of work at scale 0.05 = 20 ms each,
    # except across a sync, where the host launches the next steps first.
    assert min(gaps) == pytest.approx(0.02, rel=0.05)
    for step in steps:
        assert step["launched"] < step["t"]  # launched asynchronously, ahead of the device
    summary = events[-1]
    assert summary["event"] == "summary" and summary["steps"] == 12
    assert 25 < summary["steps_per_s"] <= 50


def test_train_input_wait_leaves_the_device_idle_between_steps(
    daemon: Daemon, tmp_path: Path
) -> None:
    # 20 ms steps (0.4 s of work at scale 0.05), each followed by 30 ms of host input: the
    # device computes about 40% of the loop's time (the demand a trainer like it shows)
    argv = ["train", "--steps", "8", "--sync-every", "1", "--step-work", "0.4"]
    events = run(daemon, tmp_path, *argv, "--kernels", "1", "--input-wait", "0.03")
    steps = of(events, "step")
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(steps)]
    assert min(gaps) >= 0.02 + 0.03 - 0.005  # a step's work and the input wait before it
    summary = events[-1]
    # at most 8 steps' work and the 7 input waits between them (none before the first)
    assert 8 < summary["steps_per_s"] <= 8 / (8 * 0.02 + 7 * 0.03)


def test_oneshot_light_task_spreads_its_kernels_over_host_work(
    daemon: Daemon, tmp_path: Path
) -> None:
    # 8 kernels of 0.2 s of work (10 ms at scale 0.05) with 15 ms of host work between them:
    # the GPU is busy 40% of the time the task computes
    argv = ["--memory-bytes", "3MiB", "--work-seconds", "1.6", "--kernels", "8"]
    events = run(daemon, tmp_path, *argv, "--host-gap", "0.015")
    (end,) = of(events, "kernel_end")
    span = end["device_ended"] - end["device_started"]
    assert span == pytest.approx(8 * 0.01 + 7 * 0.015, abs=0.02)
    assert 1.6 * SCALE / span == pytest.approx(0.43, abs=0.06)


def test_oneshot_keep_context_keeps_cached_memory(daemon: Daemon, tmp_path: Path) -> None:
    log = tmp_path / "k.log"
    argv = [sys.executable, "-m", "gpuguard.gpusim.workload", "--socket", str(daemon.socket_path)]
    argv += ["--memory-bytes", "3GiB", "--work-seconds", "1", "--repeat", "2"]
    argv += ["--sleep-between", "1", "--keep-context", "--log", str(log)]
    proc = subprocess.Popen(argv)
    try:
        with GpusimClient(daemon.socket_path) as observer:

            def between_runs() -> bool:
                text = log.read_text() if log.exists() else ""
                names = [json.loads(x)["event"] for x in text.splitlines()]
                return names.count("task_end") == 1

            wait_for(between_runs, timeout=20, interval=0.01)
            # The task ended and freed its matrices, but its cache keeps them reserved.
            (process,) = observer.sample()["devices"][0]["processes"]
            assert process["pid"] == proc.pid
            assert process["used_memory_bytes"] == 100 * 2**20 + 3 * GIB
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait(timeout=5)
    names = [json.loads(x)["event"] for x in log.read_text().splitlines()]
    assert names.count("context_created") == 1 and names.count("task_end") == 2


def test_one_process_on_two_devices(daemon: Daemon, tmp_path: Path) -> None:
    log = tmp_path / "two.log"
    argv = [sys.executable, "-m", "gpuguard.gpusim.workload", "train", "--devices", "0,1"]
    argv += ["--socket", str(daemon.socket_path), "--steps", "100000", "--step-work", "1"]
    argv += ["--log", str(log)]
    proc = subprocess.Popen(argv)
    try:
        with GpusimClient(daemon.socket_path) as observer:

            def on_both() -> list[list[int]] | None:
                status = observer.status()["devices"]
                pids = [[p["pid"] for p in d["processes"]] for d in status]
                busy = all(d["utilization_ratio"] > 0.5 for d in status)
                return pids if busy and pids == [[proc.pid], [proc.pid]] else None

            wait_for(on_both, timeout=20, interval=0.02)
            wait_for(lambda: "step" in log.read_text(), timeout=20, interval=0.02)
    finally:
        proc.kill()
        proc.wait(timeout=5)
    step = next(json.loads(x) for x in log.read_text().splitlines() if '"step"' in x)
    assert step["devices"] == ["0", "1"]


def test_arrival_schedules() -> None:
    fixed = rate_arrivals(4.0, poisson=False, work=0.1, nbytes=10, seed=1)
    assert [next(fixed).offset for _ in range(3)] == [0.0, 0.25, 0.5]
    poisson = rate_arrivals(10.0, poisson=True, work=0.1, nbytes=10, seed=3)
    offsets = [next(poisson).offset for _ in range(2000)]
    assert offsets == sorted(offsets)
    assert offsets[-1] / 2000 == pytest.approx(0.1, rel=0.1)  # mean gap 1 / rate
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert percentile([], 0.5) is None


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ('{"t": 1}\n{"t": 0.5}\n', "line 2: t goes back"),
        ('{"work": 1}\n', "line 1: missing 't'"),
        ('{"t": -1}\n', "'t' must be >= 0"),
        ('{"t": 0, "work": 0}\n', "'work' must be > 0"),
        ("[1]\n", "JSON object"),
        ("nope\n", "line 1"),
        ("\n", "no requests"),
    ],
)
def test_bad_traces(trace: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_trace(trace.splitlines(), 0.1, 10)


@pytest.mark.parametrize(
    "argv",
    [
        ["server", "--requests", "3"],  # neither rate nor trace
        ["server", "--rate", "5"],  # endless
        ["server", "--rate", "5", "--trace", "t.jsonl", "--requests", "1"],
        ["train", "--sync-every", "0"],
        ["train", "--input-wait", "-1"],
        ["train", "--devices", "0,0"],
        ["oneshot", "--backend", "cuda", "--device", "0:1"],
        ["mine", "--size", "1"],
    ],
)
def test_bad_workload_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("gpusim.workload: error:") and err.count("\n") == 1


def test_a_bad_trace_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"t": 2}\n{"t": 1}\n')
    assert main(["server", "--trace", str(trace), "--log", str(tmp_path / "x")]) == 2
    assert "t goes back" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # nothing ran


@pytest.fixture
def no_cuda_libraries() -> Iterator[None]:
    saved = {name: sys.modules.get(name) for name in ("torch", "cupy")}
    sys.modules.update({"torch": None, "cupy": None})  # type: ignore[dict-item]
    yield
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


def test_cuda_backend_without_torch_or_cupy_exits_1(
    no_cuda_libraries: None, tmp_path: Path
) -> None:
    log = tmp_path / "c.log"
    assert main(["train", "--backend", "cuda", "--log", str(log)]) == 1
    last = json.loads(log.read_text().splitlines()[-1])
    assert (last["event"], last["error"]) == ("error", "no_cuda")


def test_sigterm_ends_a_long_lived_workload_with_its_summary(
    daemon: Daemon, tmp_path: Path
) -> None:
    log = tmp_path / "term.log"
    argv = [sys.executable, "-m", "gpuguard.gpusim.workload", "server", "--rate", "50"]
    argv += ["--duration", "600", "--socket", str(daemon.socket_path), "--log", str(log)]
    proc = subprocess.Popen(argv)
    try:
        wait_for(lambda: log.exists() and '"request"' in log.read_text(), timeout=20)
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait(timeout=5)
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["event"] == "summary" and last["requests"] >= 1
