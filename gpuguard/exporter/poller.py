"""The poll loop: sample -> hold -> resolve owners -> join -> track, once per
``--poll.interval`` (hold: a process's last SM sample stands until the next is due,
``gpuguard/exporter/samples.py``).

Each poll ends in an immutable ``PollSnapshot`` that /metrics and /api/v1/state read; they
never call NVML or Docker. A failing source is recorded (success 0, errors + 1) and the
poll still completes; a failed GPU sample leaves the running tasks as they were (they are
not ended because a sample is missing) while deadlines keep being checked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpuguard.contract import TaskMode
from gpuguard.exporter.activity import ContainerActivity
from gpuguard.exporter.backends.base import GpuBackend
from gpuguard.exporter.cgroup import ProcReader
from gpuguard.exporter.errors import BackendError, ProcfsError
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.inflight import GaugeReading
from gpuguard.exporter.join import join
from gpuguard.exporter.launchprobe import ProbeStatus
from gpuguard.exporter.model import ContainerInfo, GpuSample, Joined, ProcessOwner
from gpuguard.exporter.record import NodeRecorder
from gpuguard.exporter.samples import SampleHold
from gpuguard.exporter.tracker import ContainerStats, RunHistogram, TaskView, Tracker
from gpuguard.exporter.trust import TRUSTING
from gpuguard.noderecord import NodeRecord

log = logging.getLogger(__name__)

#: the ``source`` label values: the GPU, the container source followed (``docker`` or
#: ``containerd``, its ``ENGINE``) and /proc
SOURCES = ("gpu", "docker", "containerd", "procfs")


class ContainerSource(Protocol):
    """What the poller needs from the container index (``containers.ContainerIndex``,
    ``containerd.ContainerdIndex``)."""

    #: the engine it follows, its ``source`` in the exporter's health series
    ENGINE: str
    connected: bool
    errors: int
    resync_duration_s: float
    last_error: str | None

    def snapshot(self) -> Mapping[str, ContainerInfo]: ...


@dataclass(frozen=True, slots=True)
class SourceStatus:
    success: bool
    duration_s: float
    errors: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PollSnapshot:
    """Everything one poll produced; read by the collector and the HTTP API."""

    generation: int
    node: str
    backend: str
    timestamp: float
    poll_interval_s: float
    poll_duration_s: float
    polls_total: int
    seq: int
    sample: GpuSample | None  # None when the GPU source failed this poll
    joined: Joined | None
    containers: Mapping[str, ContainerInfo]
    tasks: tuple[TaskView, ...]
    recent: tuple[TaskView, ...]
    stats: Mapping[str, ContainerStats]
    histograms: Mapping[str, RunHistogram]
    sources: Mapping[str, SourceStatus] = field(default_factory=dict)
    record: NodeRecord | None = None  # paper C's node record (gpuguard/exporter/record.py)
    default_task_mode: TaskMode = TaskMode.BURST  # for containers without gpuguard.task
    demand: Mapping[str, float] = field(default_factory=dict)  # container id -> SM share
    typical_run: Mapping[str, float] = field(default_factory=dict)  # container id -> run s
    longest_run: Mapping[str, float] = field(default_factory=dict)  # container id -> run s
    #: the trust policy in force: (kind, file) (gpuguard/exporter/trust.py)
    trust_policy: tuple[str, str] = (TRUSTING, "")
    #: the launch probe's view per container id (gpuguard/exporter/activity.py), and its status
    activity: Mapping[str, ContainerActivity] = field(default_factory=dict)
    probe: ProbeStatus | None = None
    #: servers' own in-flight gauges per container id (gpuguard/exporter/inflight.py)
    inflight: Mapping[str, GaugeReading] = field(default_factory=dict)


def _not_connected(engine: str, error: str | None) -> str:
    return f"not connected to {engine} ({error or 'no answer yet'})"


class Poller:
    """Runs the pipeline at a fixed rate in its own thread."""

    def __init__(
        self,
        backend: GpuBackend,
        containers: ContainerSource,
        proc: ProcReader,
        tracker: Tracker,
        events: EventLog,
        node: str,
        interval_s: float,
        clock: Callable[[], float] = time.time,
        recorder: NodeRecorder | None = None,
        trust_policy: tuple[str, str] = (TRUSTING, ""),
        activity: Callable[[], Mapping[str, ContainerActivity]] = dict,
        probe: Callable[[], ProbeStatus | None] = lambda: None,
        inflight: Callable[[], Mapping[str, GaugeReading]] = dict,
    ) -> None:
        self.backend = backend
        self.containers = containers
        self.proc = proc
        self.tracker = tracker
        self.events = events
        self.node = node
        self.interval_s = interval_s
        self._clock = clock
        self.recorder = recorder or NodeRecorder(node)
        self.trust_policy = trust_policy
        self.activity = activity
        self.probe = probe
        self.inflight = inflight
        self.hold = SampleHold()
        self._errors = {"gpu": 0, "procfs": 0}
        self._polls = 0
        self._ever_sampled = False
        self._last_gpu_error: str | None = "no poll yet"
        self.snapshot: PollSnapshot | None = None

    def health(self) -> str | None:
        """None when healthy (a GPU sample succeeded at least once), else the reason."""
        return (
            None if self._ever_sampled else f"no successful GPU sample yet: {self._last_gpu_error}"
        )

    def degraded(self) -> str | None:
        """What fails while the exporter still serves (for /healthz), or None.

        A failing source does not make the exporter unhealthy (a restart would not cure a
        socket it may not open), but it must not look fine either: without its container
        source no GPU process is attributed to a container, and the actuator can act on none.
        """
        snap = self.snapshot
        if snap is None:
            return None
        failing = [
            f"{source} source failing: {status.error or 'no answer'}"
            for source, status in snap.sources.items()
            if not status.success
        ]
        return "degraded: " + "; ".join(failing) if failing else None

    def poll_once(self) -> PollSnapshot:
        started = time.perf_counter()
        sample, gpu_status = self._sample_gpu()
        # seq before the container snapshot: a follower resuming from it may see an event
        # twice (harmless) but never misses one that the snapshot does not reflect.
        seq = self.events.seq
        containers = self.containers.snapshot()
        owners, procfs_status = self._owners(sample)
        joined = None
        probe = self.probe()
        # the probe's view times tasks only while it is attached (a stopped probe's view is
        # frozen at its last tick)
        activity = self.activity() if probe is not None and probe.attached else {}
        if sample is not None:
            joined = join(sample, owners, containers)
            self.tracker.update(joined, sample.timestamp, containers, activity)
        else:
            self.tracker.check_deadlines(self._clock())
        if self.containers.connected:
            self.tracker.forget_containers(containers)
        self._polls += 1
        engine = self.containers.ENGINE
        container_status = SourceStatus(
            self.containers.connected,
            self.containers.resync_duration_s,
            self.containers.errors,
            None
            if self.containers.connected
            else _not_connected(engine, self.containers.last_error),
        )
        timestamp = sample.timestamp if sample is not None else self._clock()
        tasks = self.tracker.running()
        recent = tuple(self.tracker.recent)
        snapshot = PollSnapshot(
            generation=self._polls,
            node=self.node,
            backend=self.backend.name,
            timestamp=timestamp,
            poll_interval_s=self.interval_s,
            poll_duration_s=time.perf_counter() - started,
            polls_total=self._polls,
            seq=seq,
            sample=sample,
            joined=joined,
            containers=containers,
            tasks=tasks,
            recent=recent,
            stats=dict(self.tracker.stats),
            histograms=self.tracker.histograms(),
            sources={"gpu": gpu_status, engine: container_status, "procfs": procfs_status},
            record=self.recorder.update(timestamp, sample, joined, tasks, recent, containers),
            default_task_mode=self.tracker.rules.default_mode,
            demand=self.tracker.demand_view(),
            typical_run=dict(self.tracker.typical_run),
            longest_run=self.tracker.longest_run(),
            trust_policy=self.trust_policy,
            activity=self.activity(),
            probe=probe,
            inflight=self.inflight(),
        )
        self.snapshot = snapshot
        return snapshot

    def with_live_activity(self, snap: PollSnapshot | None) -> PollSnapshot | None:
        """The snapshot with the launch probe's and the gauges' views as of now."""
        if snap is None:
            return None
        return replace(snap, activity=self.activity(), inflight=self.inflight())

    def _sample_gpu(self) -> tuple[GpuSample | None, SourceStatus]:
        started = time.perf_counter()
        try:
            sample = self.hold.apply(self.backend.sample())
        except BackendError as exc:
            self._errors["gpu"] += 1
            if self._last_gpu_error != str(exc):
                log.warning("gpu backend %s: %s", self.backend.name, exc)
            self._last_gpu_error = str(exc)
            return None, SourceStatus(
                False, time.perf_counter() - started, self._errors["gpu"], str(exc)
            )
        if self._last_gpu_error is not None and self._ever_sampled:
            log.info("gpu backend %s: sampling again", self.backend.name)
        self._ever_sampled = True
        self._last_gpu_error = None
        return sample, SourceStatus(True, time.perf_counter() - started, self._errors["gpu"])

    def _owners(
        self, sample: GpuSample | None
    ) -> tuple[dict[int, ProcessOwner | None], SourceStatus]:
        started = time.perf_counter()
        owners: dict[int, ProcessOwner | None] = {}
        try:
            self.proc.check()
        except ProcfsError as exc:
            self._errors["procfs"] += 1
            return owners, SourceStatus(
                False, time.perf_counter() - started, self._errors["procfs"], str(exc)
            )
        if sample is not None:
            for device in sample.devices:
                for proc in device.processes:
                    if proc.pid not in owners:
                        owners[proc.pid] = self.proc.owner(proc.pid)
            self.proc.retain(set(owners))
        return owners, SourceStatus(True, time.perf_counter() - started, self._errors["procfs"])

    def run(self, stop: threading.Event) -> None:
        """Poll at a fixed rate until ``stop`` is set; a late poll does not cause a burst."""
        next_tick = time.monotonic()
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:  # the loop's boundary: log and keep polling
                log.exception("poll failed")
            next_tick += self.interval_s
            delay = next_tick - time.monotonic()
            if delay < 0:
                next_tick = time.monotonic()
                delay = 0
            stop.wait(delay)
