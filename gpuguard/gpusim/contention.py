"""The contention and time model of the simulated GPU. Pure: no I/O, no clock of its own.

Kernels time-slice the device: each of n concurrently running kernels progresses at
``1 / (n * factor(n))`` device-seconds per second, where ``factor(n) = T_n / (n * T_1)`` is the
context-switch overhead of a device profile's measured curve (paper B's table by default;
the curve is ``gpuguard/slowdown.py``, shared with the placer).
A MIG instance is an engine of its own with a share of the GPU's compute slices, so its
kernels run at that share of the speed. Copies in each direction share that direction's
bandwidth equally. Every method takes the time explicitly, so a test drives the simulator
with a fake clock and gets the same answer every time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from gpuguard.slowdown import PAPER_B_KERNEL_S, PAPER_B_SIZE, slowdown_factor

#: Defaults calibrated on paper B's single-task copies: 2 matrices of 13,312^2 float32 in
#: about 0.189 s, one out in about 0.32 s.
COPY_IN_BYTES_PER_S = 7.5e9
COPY_OUT_BYTES_PER_S = 2.2e9

# Relative tolerance under which a job's remaining amount counts as done (float residue).
_DONE_TOLERANCE = 1e-9


def kernel_rate(
    n: int,
    time_scale: float = 1.0,
    kernel_s: tuple[float, ...] = PAPER_B_KERNEL_S,
    compute_fraction: float = 1.0,
) -> float:
    """Device-seconds of work each of ``n`` concurrent kernels completes per wall second."""
    return compute_fraction / (n * slowdown_factor(n, kernel_s) * time_scale)


def matmul_flops(size: int) -> float:
    """Floating-point operations of one ``size`` x ``size`` matmul (2 N^3)."""
    return 2.0 * float(size) ** 3


def matmul_work_s(size: int) -> float:
    """Kernel work (device-seconds at time scale 1) of one ``size`` x ``size`` float32 matmul."""
    return PAPER_B_KERNEL_S[0] * (size / PAPER_B_SIZE) ** 3


def matmul_bytes(size: int) -> int:
    """GPU memory of one matmul: three ``size`` x ``size`` float32 matrices."""
    return 3 * size * size * 4


class JobKind(StrEnum):
    """The three resources a job can occupy; each is processor-shared on its own."""

    KERNEL = "kernel"
    COPY_IN = "copy_in"
    COPY_OUT = "copy_out"


@dataclass(eq=False)
class Job:
    """A kernel (amount in device-seconds) or a copy (amount in bytes) in flight."""

    id: int
    kind: JobKind
    pid: int
    amount: float
    started: float
    remaining: float
    finished: float | None = None


@dataclass(frozen=True)
class Segment:
    """An interval during which the set of running jobs did not change.

    ``sm_share`` maps a pid to its share of the SM time (1/n per running kernel);
    ``copy_share`` maps a pid to its share of copy bandwidth, summed over both directions.
    """

    start: float
    end: float
    sm_share: dict[int, float]
    copy_share: dict[int, float]


@dataclass
class ContentionSimulator:
    """Processor-sharing simulator of one device: kernels, copies in, copies out.

    ``advance(t)`` moves the simulation to time ``t`` and returns the jobs that finished on
    the way, with their exact finish times; ``next_completion_time()`` tells a driver when to
    call ``advance`` next. Times earlier than ``now`` are treated as ``now``.
    """

    time_scale: float = 1.0
    copy_time_scale: float = 1.0
    copy_in_bytes_per_s: float = COPY_IN_BYTES_PER_S
    copy_out_bytes_per_s: float = COPY_OUT_BYTES_PER_S
    #: The profile's overhead curve: kernel time of each of n concurrent reference kernels.
    concurrent_kernel_s: tuple[float, ...] = PAPER_B_KERNEL_S
    #: Share of the GPU's compute this engine has (a MIG instance's slices out of 7).
    compute_fraction: float = 1.0
    now: float = 0.0
    jobs: dict[JobKind, list[Job]] = field(default_factory=lambda: {kind: [] for kind in JobKind})
    #: Called with every busy interval simulated (usage accounting listens here).
    on_segment: Callable[[Segment], None] | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        names = ("time_scale", "copy_time_scale", "copy_in_bytes_per_s", "copy_out_bytes_per_s")
        for name in (*names, "compute_fraction"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if not self.concurrent_kernel_s or min(self.concurrent_kernel_s) <= 0:
            raise ValueError("concurrent_kernel_s must be a non-empty list of times > 0")

    def rate(self, kind: JobKind) -> float:
        """Progress per wall second of each job of ``kind`` given how many share it now."""
        n = len(self.jobs[kind])
        if n == 0:
            return 0.0
        if kind is JobKind.KERNEL:
            return kernel_rate(n, self.time_scale, self.concurrent_kernel_s, self.compute_fraction)
        bandwidth = (
            self.copy_in_bytes_per_s if kind is JobKind.COPY_IN else self.copy_out_bytes_per_s
        )
        return bandwidth / (n * self.copy_time_scale)

    def add_job(self, t: float, kind: JobKind, amount: float, pid: int) -> tuple[Job, list[Job]]:
        """Start a job at ``t``; returns it and the jobs that finished before ``t``."""
        if amount <= 0:
            raise ValueError(f"job amount must be > 0, got {amount}")
        finished = self.advance(t)
        job = Job(next(self._ids), kind, pid, float(amount), self.now, float(amount))
        self.jobs[kind].append(job)
        return job, finished

    def cancel(self, t: float, job: Job) -> list[Job]:
        """Drop a job that has not finished (its process went away); returns jobs finished."""
        finished = self.advance(t)
        if job in self.jobs[job.kind]:
            self.jobs[job.kind].remove(job)
        return finished

    def next_completion_time(self) -> float | None:
        """When the next running job finishes if nothing else arrives, or None when idle."""
        found = self._next_completion()
        return None if found is None else found[0]

    def advance(self, t: float) -> list[Job]:
        """Run the simulation up to ``t``; returns the jobs that finished, in finish order."""
        done: list[Job] = []
        while True:
            found = self._next_completion()
            if found is None or found[0] > t:
                break
            when, job = found
            self._progress(when)
            job.remaining = 0.0  # exact: it is the one that determined ``when``
            done.extend(self._collect_finished())
        self._progress(t)
        return done

    def running(self, kind: JobKind | None = None) -> list[Job]:
        """Jobs in flight, of one kind or all."""
        if kind is not None:
            return list(self.jobs[kind])
        return [job for jobs in self.jobs.values() for job in jobs]

    def current_segment_shares(self) -> tuple[dict[int, float], dict[int, float]]:
        """Per-pid SM share and copy share of the jobs running now."""
        sm: dict[int, float] = {}
        kernels = self.jobs[JobKind.KERNEL]
        for job in kernels:
            sm[job.pid] = sm.get(job.pid, 0.0) + 1.0 / len(kernels)
        copy: dict[int, float] = {}
        for kind in (JobKind.COPY_IN, JobKind.COPY_OUT):
            for job in self.jobs[kind]:
                copy[job.pid] = copy.get(job.pid, 0.0) + 1.0 / len(self.jobs[kind])
        return sm, copy

    def _next_completion(self) -> tuple[float, Job] | None:
        best: tuple[float, Job] | None = None
        for kind, jobs in self.jobs.items():
            if not jobs:
                continue
            job = min(jobs, key=lambda j: j.remaining)
            when = self.now + job.remaining / self.rate(kind)
            if best is None or when < best[0]:
                best = (when, job)
        return best

    def _progress(self, t: float) -> None:
        if t <= self.now:
            return
        dt = t - self.now
        sm, copy = self.current_segment_shares()
        for kind, jobs in self.jobs.items():
            step = self.rate(kind) * dt
            for job in jobs:
                job.remaining = max(0.0, job.remaining - step)
        if self.on_segment is not None and (sm or copy):
            self.on_segment(Segment(self.now, t, sm, copy))
        self.now = t

    def _collect_finished(self) -> list[Job]:
        done: list[Job] = []
        for jobs in self.jobs.values():
            for job in list(jobs):
                if job.remaining <= job.amount * _DONE_TOLERANCE:
                    job.remaining = 0.0
                    job.finished = self.now
                    jobs.remove(job)
                    done.append(job)
        return done
