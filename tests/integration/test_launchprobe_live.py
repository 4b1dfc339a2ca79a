"""The launch probe really attached: uprobes on gpusim's libcuda.so.1, a workload's calls
counted and its task timed against its own log, on the host and through the exporter for a
container (private dockerd, gpusim, exporter)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from exporter_support import ExporterProcess, sim_mounts, workload_args, workload_log
from gpusim_support import workload as sim_workload

from gpuguard.contract import EventType
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.images import python_container_kwargs
from gpuguard.exporter.launchprobe import (
    LaunchProbe,
    LaunchSample,
    ProcLaunches,
    missing_capability,
)
from gpuguard.exporter.probe.build import probe_binary
from gpuguard.gpusim.driver import LIBRARY_NAME
from gpuguard.native import NativeBuildError
from tests.prereq import unavailable
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
#: how far the workload's own log line may be from the call it precedes or follows on a
#: loaded machine; the order is what the probe's own timing shows (a time taken at the
#: probe's 10 ms tick would come after the log line, not before). The 5 ms target is
#: bench/launchprobe.py's figure, not a test's.
SLACK_S = 0.1


@pytest.fixture
def attachable() -> Path:
    """The probe's program; skips (fails under CI) where a uprobe cannot be attached."""
    missing = missing_capability(Path("/proc/self/status").read_text())
    if missing is not None:
        unavailable(f"the launch probe {missing}")
    try:
        return probe_binary()
    except NativeBuildError as exc:
        unavailable(str(exc))
    raise AssertionError("unreachable")


class Ticks:
    """The probe's ticks, for a test to wait on: how many came, and each process's record
    as the newest tick that held it showed it (an exited process's record goes at the
    probe's next check, maybe before the test looks)."""

    def __init__(self) -> None:
        self.count = 0
        self.seen: dict[int, ProcLaunches] = {}
        self._lock = threading.Lock()

    def __call__(self, sample: LaunchSample) -> None:
        with self._lock:
            self.count += 1
            self.seen.update(sample.procs)

    def final(self, pid: int) -> ProcLaunches:
        """``pid``'s record once two more ticks came (one read wholly after its exit)."""
        after = self.count
        wait_for(lambda: self.count >= after + 2 and pid in self.seen, 5, f"process {pid}")
        return self.seen[pid]


def oneshot_log(sim: GpusimService, name: str, *args: str) -> list[dict[str, Any]]:
    argv = [sys.executable, "-m", *workload_args(sim, name, *args)]
    subprocess.run(argv, check=True, timeout=60, capture_output=True)
    return workload_log(sim, name)


def test_probe_counts_every_call_and_times_the_task(
    attachable: Path, gpusim_daemon: Callable[..., GpusimService]
) -> None:
    sim = gpusim_daemon(time_scale=0.1)
    library = sim.dir / LIBRARY_NAME
    assert library.is_file(), "gpusim serve puts its driver stand-in beside its socket"
    ticks = Ticks()
    probe = LaunchProbe(lambda: attachable, library, 0.01, ticks)
    try:
        status = probe.start()
        assert status.attached, status.detail
        assert "cuLaunchKernel_ptsz" in status.detail and "cuStreamSynchronize" in status.detail
        log = oneshot_log(sim, "one.log", "--work-seconds", "1", "--kernels", "4",
                          "--memory-bytes", "64MiB")  # fmt: skip
        pid = log[0]["pid"]
        seen = ticks.final(pid)
    finally:
        probe.stop()
    events = {e["event"]: e for e in log}
    assert seen.launches == 4, "one launch per kernel"
    assert seen.copies == 2, "one copy in, one copy out"
    # each kernel's synchronize, and the wait after each copy
    assert seen.waits == 4 + 2 and seen.waiting_since is None
    assert seen.first is not None and seen.wait_end is not None
    # the first launch comes right after kernel_start is logged; the last wait returns
    # (copy out) right before output_end is logged
    assert 0 <= seen.first - events["kernel_start"]["t"] < SLACK_S
    assert 0 <= events["output_end"]["t"] - seen.wait_end < SLACK_S
    assert seen.wait_s >= 0.9 * 0.1, "the kernels' 0.1 s were spent in waits"
    assert seen.inputs == 0, "one run: no input after an output"


def test_probe_sees_the_next_runs_input_after_the_last_runs_output(
    attachable: Path, gpusim_daemon: Callable[..., GpusimService]
) -> None:
    """Runs back to back: each run's first copy in after the run before copied out is a
    next input, with the last launch before it."""
    sim = gpusim_daemon(time_scale=0.1)
    ticks = Ticks()
    probe = LaunchProbe(lambda: attachable, sim.dir / LIBRARY_NAME, 0.01, ticks)
    try:
        assert probe.start().attached
        log = oneshot_log(sim, "again.log", "--work-seconds", "0.5", "--kernels", "2",
                          "--memory-bytes", "64MiB", "--repeat", "3")  # fmt: skip
        pid = log[0]["pid"]
        seen = ticks.final(pid)
    finally:
        probe.stop()
    assert seen.inputs == 2, "runs 1 and 2 each began after an output"
    inputs = [e["t"] for e in log if e["event"] == "input_start"]
    kernels = [e["t"] for e in log if e["event"] == "kernel_start"]
    outputs = [e["t"] for e in log if e["event"] == "output_start"]
    assert seen.input_start is not None and seen.input_after is not None
    # the newest: run 2's first copy in, logged just before it
    assert 0 <= seen.input_start - inputs[2] < SLACK_S
    # the last launch before it: run 1's second kernel, after run 1's kernel_start line
    assert kernels[1] < seen.input_after < outputs[1]


def test_a_probe_on_a_file_without_the_entry_points_says_so(
    attachable: Path, tmp_path: Path
) -> None:
    library = tmp_path / "libnothing.so"
    source = tmp_path / "nothing.c"
    source.write_text("int nothing(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    probe = LaunchProbe(lambda: attachable, library, 0.01, lambda _s: None)
    status = probe.start()
    assert not status.attached and status.reason == "no_library"
    assert "no launch entry point" in status.detail


@pytest.fixture
def exporter_flags() -> tuple[str, ...]:
    return ("--poll.interval=50ms",)


def test_exporter_sees_a_containers_task_through_the_probe(
    attachable: Path,
    sim: GpusimService,
    exporter: ExporterProcess,
    run_python_container: Callable[..., Any],
) -> None:
    assert exporter.metric("gpuguard_exporter_launch_probe_up", reason="") == 1
    start = exporter.events()["next"]
    args = ["--work-seconds", "2", "--kernels", "3", "--memory-bytes", "64MiB"]
    container = run_python_container(
        workload(sim, "probed.log", *args), extra_mounts=sim_mounts(sim), name="probed"
    )
    assert container.wait(timeout=60)["StatusCode"] == 0
    log = {e["event"]: e for e in workload_log(sim, "probed.log")}

    def edges() -> list[dict[str, Any]]:
        batch = exporter.events(start)["events"]
        kinds = (EventType.GPU_BUSY, EventType.GPU_IDLE)
        return [e for e in batch if e["type"] in kinds and e.get("container") == "probed"]

    wait_for(lambda: len(edges()) >= 2, 10, "the container's busy and idle edges")
    busy, idle = edges()[:2]
    assert (busy["type"], idle["type"]) == (EventType.GPU_BUSY, EventType.GPU_IDLE)
    # one task: first launch to the return of the last wait (the copy out's)
    assert 0 <= busy["ts"] - log["kernel_start"]["t"] < SLACK_S
    assert 0 <= log["output_end"]["t"] - idle["ts"] < SLACK_S
    assert idle["busy_since"] == busy["ts"]
    short = container.id[:12]
    wait_for(
        lambda: exporter.metric("gpuguard_container_launches_total", container_id=short) == 3,
        5,
        "three launches on /metrics",
    )
    source = exporter.metric(
        "gpuguard_container_activity_source", container_id=short, source="launch", reason=""
    )
    assert source == 1
    # /metrics reads the last poll's snapshot: it may lag the event stream by one poll
    wait_for(
        lambda: exporter.metric("gpuguard_container_launch_tasks_total", container_id=short) == 1,
        5,
        "the task counted on /metrics",
    )
    busy_s = exporter.metric("gpuguard_container_launch_busy_seconds_total", container_id=short)
    assert busy_s == pytest.approx(idle["ts"] - busy["ts"], abs=1e-3)

    # the tracker's task ends at the probe's last wait's return and is judged; it copied its
    # input before its first launch, so it starts where the samples first saw it (its
    # memory), as its own log's task does, not at its first launch
    def ended() -> list[dict[str, Any]]:
        batch = exporter.events(start)["events"]
        return [
            e for e in batch if e["type"] == EventType.TASK_ENDED and e.get("container") == "probed"
        ]

    wait_for(lambda: len(ended()) >= 1, 10, "the tracker's task ended")
    (task,) = [e for e in ended() if e["boundary"] == "exact"]
    assert task["ts"] == pytest.approx(idle["ts"], abs=1e-6)
    began = task["ts"] - task["run_s"]
    start_error = began - log["task_start"]["t"]
    end_error = log["output_end"]["t"] - task["ts"]
    print(f"task start {start_error * 1e3:.2f} ms after task_start, "
          f"end {end_error * 1e3:.2f} ms before output_end")  # fmt: skip
    # placed half-way between the poll that saw its memory and the one before
    assert start_error >= -0.05 and began <= log["input_start"]["t"] + SLACK_S
    assert 0 <= end_error < SLACK_S


def test_exporter_judges_each_of_a_servers_requests_through_the_probe(
    attachable: Path,
    sim: GpusimService,
    exporter: ExporterProcess,
    run_python_container: Callable[..., Any],
) -> None:
    """Requests 200 ms apart (NVML's samples would see one merged busy period): each is an
    exact task of its own, timed as the server logged it, and judged as it was. They begin
    a while after the server loaded its model: a request copied in right after that upload
    would be taken for a one-shot's input, one task with the start-up."""
    start = exporter.events()["next"]
    args = ["server", "--arrivals", "fixed", "--rate", "5", "--requests", "6",
            "--request-work", "1", "--kernels", "2", "--memory-bytes", "64MiB",
            "--start-at", f"{time.time() + 4.0:.3f}"]  # fmt: skip
    container = run_python_container(
        sim_workload(sim, "served", *args), labels={"gpuguard.deadline": "1s"},
        extra_mounts=sim_mounts(sim), name="served",
    )  # fmt: skip
    assert container.wait(timeout=60)["StatusCode"] == 0
    own = [e for e in workload_log(sim, "served.log") if e["event"] == "request"]
    assert len(own) == 6

    def ended() -> list[dict[str, Any]]:
        batch = exporter.events(start)["events"]
        return [
            e for e in batch if e["type"] == EventType.TASK_ENDED and e.get("container") == "served"
        ]

    # the model upload's task (no kernel) ends before the first request
    wait_for(lambda: sum(e["boundary"] != "no_kernel" for e in ended()) >= 6, 10, "six tasks ended")
    tasks = [e for e in ended() if e["boundary"] == "exact"]
    assert len(tasks) == 6, [e["boundary"] for e in ended()]
    errors = []
    for request, task in zip(own, tasks, strict=True):
        began, finished = task["ts"] - task["run_s"], task["ts"]
        errors += [began - request["start"], request["end"] - finished]
        assert 0 <= began - request["start"] < SLACK_S
        assert 0 <= request["end"] - finished < SLACK_S
    print(f"requests: start/end error max {max(errors) * 1e3:.2f} ms")
    short = container.id[:12]
    wait_for(
        lambda: exporter.metric("gpuguard_container_deadline_hits_total", container_id=short) == 6,
        5,
        "six hits on /metrics",
    )
    assert all(e["boundary"] != "merged" for e in ended())  # no busy time: all judged


def test_exporter_times_each_run_back_to_back_from_its_own_input(
    attachable: Path,
    sim: GpusimService,
    exporter: ExporterProcess,
    run_python_container: Callable[..., Any],
) -> None:
    """A program that keeps its context and goes straight on (each run copies its input as
    soon as the last one copied its output: one busy period for all of them): each run is
    an exact task that starts at its own input, where its log's task starts, and ends where
    the next began. Its input (~0.2 s) is longer than a poll, so the first run is seen in its
    input, as a task that began with it (first seen with its kernel, a run would be taken
    for a request, and requests back to back are busy time)."""
    start = exporter.events()["next"]
    args = ["--work-seconds", "6", "--kernels", "2", "--memory-bytes", "2GiB", "--repeat", "3",
            "--keep-context"]  # fmt: skip
    container = run_python_container(
        workload(sim, "again.log", *args), labels={"gpuguard.deadline": "5s"},
        extra_mounts=sim_mounts(sim), name="again",
    )  # fmt: skip
    assert container.wait(timeout=60)["StatusCode"] == 0
    own = workload_log(sim, "again.log")
    runs = [e["t"] for e in own if e["event"] == "task_start"]
    ends = [e["t"] for e in own if e["event"] == "output_end"]
    assert len(runs) == 3

    def ended() -> list[dict[str, Any]]:
        batch = exporter.events(start)["events"]
        return [
            e for e in batch if e["type"] == EventType.TASK_ENDED and e.get("container") == "again"
        ]

    wait_for(lambda: len(ended()) >= 3, 10, "three tasks ended")
    tasks = ended()
    assert [e["boundary"] for e in tasks] == ["exact"] * 3
    began = [e["ts"] - e["run_s"] for e in tasks]
    # the first starts where NVML first saw its memory (half-way between two polls); the
    # next ones at their first copy in, just after their log's task_start
    assert began[0] - runs[0] >= -0.05 and began[0] < runs[0] + SLACK_S
    for own_start, task_start in zip(runs[1:], began[1:], strict=True):
        assert 0 <= task_start - own_start < SLACK_S
    for own_end, task in zip(ends, tasks, strict=True):
        assert abs(task["ts"] - own_end) < SLACK_S


def workload(sim: GpusimService, name: str, *args: str) -> list[str]:
    return workload_args(sim, name, *args)


def test_exporter_without_permission_falls_back_and_says_why(
    sim: GpusimService, dockerd: Any, tmp_path: Path
) -> None:
    """``capsh`` drops CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN: the exporter runs on NVML's
    (gpusim's) samples and says why on /metrics and in its log."""
    capsh = "/usr/sbin/capsh" if Path("/usr/sbin/capsh").exists() else None
    if capsh is None:
        unavailable("capsh not installed (libcap2-bin)")
    exporter = ExporterProcess(tmp_path, dockerd.url, sim.socket)
    drop = "--drop=cap_bpf,cap_perfmon,cap_sys_admin"
    exporter.process.argv = [capsh, drop, "--", "-c", " ".join(exporter.process.argv)]
    exporter.start()
    try:
        assert exporter.metric("gpuguard_exporter_launch_probe_up", reason="no_permission") == 0
    finally:
        exporter.stop()
    time.sleep(0.1)
    text = (tmp_path / f"exporter-{exporter.port}.log").read_text()
    assert "launch probe not running (no_permission)" in text


@pytest.mark.parametrize("exporter_flags", [("--poll.interval=50ms", "--probe.launch=off")])
def test_exporter_sees_a_server_through_its_own_gauge(
    sim: GpusimService,
    exporter: ExporterProcess,
    docker_client: Any,
    base_image: str,
    exporter_flags: tuple[str, ...],
) -> None:
    """Without the probe, a server that declares its in-flight gauge is seen through it:
    busy and idle edges around each request, and the gauge source on /metrics."""
    from gpuguard.demo.stack.process import free_port

    port = free_port()
    start = exporter.events()["next"]
    args = ["server", "--arrivals", "fixed", "--rate", "2", "--requests", "3",
            "--request-work", "4", "--memory-bytes", "64MiB", "--metrics-port", str(port),
            "--start-at", f"{time.time() + 3:.3f}"]  # fmt: skip
    labels = {"gpuguard.inflight.metric": "vllm_num_requests_running",
              "gpuguard.inflight.port": str(port)}  # fmt: skip
    kwargs = python_container_kwargs(
        sim_workload(sim, "gauged", *args), labels=labels, extra_mounts=sim_mounts(sim),
        name="gauged",
    )  # fmt: skip
    kwargs["network_mode"] = "host"  # its /metrics on the host's loopback
    container = docker_client.containers.run(**kwargs)
    try:
        check_gauged(sim, exporter, container, start)
    finally:
        container.remove(force=True)


def check_gauged(sim: GpusimService, exporter: ExporterProcess, container: Any, start: int) -> None:
    short = container.id[:12]

    def edges() -> list[dict[str, Any]]:
        batch = exporter.events(start)["events"]
        kinds = (EventType.GPU_BUSY, EventType.GPU_IDLE)
        return [e for e in batch if e["type"] in kinds and e.get("container") == "gauged"]

    found = wait_for(lambda: len(edges()) >= 2 and edges(), 30, "the gauge's busy and idle")
    assert {e["source"] for e in found} == {"gauge"}
    assert (found[0]["type"], found[1]["type"]) == (EventType.GPU_BUSY, EventType.GPU_IDLE)
    source = exporter.metric(
        "gpuguard_container_activity_source", container_id=short, source="gauge", reason="off"
    )
    assert source == 1
    assert container.wait(timeout=60)["StatusCode"] == 0
    requests = [e for e in workload_log(sim, "gauged.log") if e["event"] == "request"]
    first = requests[0]
    # read every 100 ms: the edges fall within a read or two of the request's own times
    assert first["start"] - 0.05 <= found[0]["ts"] <= first["end"] + 0.3


class EdgeFollower:
    """Long-polls the exporter's events in a thread: each ``gpu_busy`` and ``gpu_idle`` with
    when it came."""

    def __init__(self, exporter: ExporterProcess, since: int) -> None:
        self.busy: list[tuple[dict[str, Any], float]] = []
        self.idle: list[tuple[dict[str, Any], float]] = []
        self._exporter, self._since = exporter, since
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            batch = self._exporter.events(self._since, timeout=1)
            got = time.time()
            self._since = batch["next"]
            self.busy += [(e, got) for e in batch["events"] if e["type"] == EventType.GPU_BUSY]
            self.idle += [(e, got) for e in batch["events"] if e["type"] == EventType.GPU_IDLE]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def woken(edges: list[tuple[dict[str, Any], float]]) -> list[tuple[float, float]]:
    """The ``woken`` server's edges: (time the exporter gave it, time the follower got it)."""
    return [(e["ts"], got) for e, got in edges if e.get("container") == "woken"]


@pytest.mark.parametrize("exporter_flags", [("--poll.interval=50ms", "--probe.interval=1s")])
@pytest.mark.parametrize("io_bytes", ["0", "4KiB"], ids=["kernels-only", "copies-its-input"])
def test_edges_are_published_at_the_launch_and_the_task_gap_not_at_the_next_read(
    attachable: Path,
    sim: GpusimService,
    exporter: ExporterProcess,
    run_python_container: Callable[..., Any],
    exporter_flags: tuple[str, ...],
    io_bytes: str,
) -> None:
    """With the probe read once a second, each request's ``gpu_busy`` still comes within a
    fraction of that: the probe sends an idle process's launch at once. Requests 1.3 s
    apart meet the read at three phases 0.3 s apart, so one read-timed edge would come
    0.6 s late or more; each comes within 0.5 s here (the bound leaves a loaded machine's
    scheduling to the follower). A server that copies its input in and waits for the copy before
    its first launch (as ``tensor.to("cuda")`` does) is idle all the same: that wait ends
    no busy period. Each ``gpu_idle`` comes as soon after the request's end: the exporter
    asks the probe for a read when the task gap after the request's last wait is over."""
    assert exporter.metric("gpuguard_exporter_launch_probe_up", reason="") == 1
    follower = EdgeFollower(exporter, exporter.events()["next"])
    args = ["server", "--arrivals", "fixed", "--rate", "0.769", "--requests", "3",
            "--request-work", "0.05", "--kernels", "1", "--io-bytes", io_bytes,
            "--memory-bytes", "64MiB", "--start-at", f"{time.time() + 3:.3f}"]  # fmt: skip
    try:
        container = run_python_container(
            sim_workload(sim, "woken", *args), extra_mounts=sim_mounts(sim), name="woken"
        )
        assert container.wait(timeout=60)["StatusCode"] == 0
        wait_for(lambda: len(woken(follower.idle)) >= 3, 10, "the last request's idle edge")
    finally:
        follower.stop()
    starts = [e["start"] for e in workload_log(sim, "woken.log") if e["event"] == "request"]
    busy = woken(follower.busy)
    assert len(starts) == 3 and len(busy) == 3, (starts, busy)
    for start, (ts, got) in zip(starts, busy, strict=True):
        assert 0 <= ts - start < SLACK_S, "timed at the request's first launch"
        assert got - start < 0.5, f"published {1000 * (got - start):.0f} ms after the launch"
    ends = [e["end"] for e in workload_log(sim, "woken.log") if e["event"] == "request"]
    idle = woken(follower.idle)
    assert len(idle) == 3, (ends, idle)
    for end, (ts, got) in zip(ends, idle, strict=True):
        assert abs(ts - end) < SLACK_S, "timed at the request's last wait"
        assert got - end < 0.5, f"published {1000 * (got - end):.0f} ms after the request"
