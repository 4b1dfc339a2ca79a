"""The simulated GPU's state: devices, contexts, allocations, jobs in flight.

No sockets and no clock of its own: the daemon passes ``now`` (monotonic seconds) into every
call, so this is the whole of the daemon's behaviour in a form a test can drive directly.
A connection is a number; a blocking op (copy, kernel) returns no reply at once, and its
reply comes out of ``pop_completions`` when the simulated job has finished.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuguard.gpusim import errors
from gpuguard.gpusim.config import DaemonConfig, DeviceSpec
from gpuguard.gpusim.errors import GpusimError
from gpuguard.gpusim.model import ContentionSimulator, Job, JobKind
from gpuguard.gpusim.protocol import Request
from gpuguard.gpusim.usage import UsageHistory

Reply = dict[str, Any]

# Usage history kept per device; long enough for any poller, short enough to stay small.
_HISTORY_S = 10.0


@dataclass
class Context:
    """One process's CUDA-like context on one device (one per connection)."""

    pid: int
    device: int
    base_bytes: int
    allocations: dict[int, int] = field(default_factory=dict)
    job: Job | None = None

    @property
    def used_bytes(self) -> int:
        return self.base_bytes + sum(self.allocations.values())

    @property
    def phase(self) -> str:
        return "idle" if self.job is None else self.job.kind.value


@dataclass
class Device:
    """One simulated device with its own contention simulator and usage history."""

    spec: DeviceSpec
    sim: ContentionSimulator
    usage: UsageHistory
    contexts: dict[int, Context] = field(default_factory=dict)  # by connection

    @property
    def used_bytes(self) -> int:
        return sum(ctx.used_bytes for ctx in self.contexts.values())


class SimulatedGpu:
    """All devices of one daemon and the requests that act on them."""

    def __init__(self, config: DaemonConfig, now: float, wall_offset: Callable[[], float]) -> None:
        self.config = config
        self.wall_offset = wall_offset
        self.devices: list[Device] = []
        for spec in config.devices:
            usage = UsageHistory(max(_HISTORY_S, 4 * config.sample_period_s))
            sim = ContentionSimulator(
                time_scale=config.time_scale,
                copy_time_scale=config.copy_time_scale,
                copy_in_bytes_per_s=config.copy_in_bytes_per_s,
                copy_out_bytes_per_s=config.copy_out_bytes_per_s,
                now=now,
                on_segment=usage.record,
            )
            self.devices.append(Device(spec, sim, usage))
        self.contexts: dict[int, Context] = {}  # by connection
        self._next_handle = 1
        self._job_owner: dict[int, int] = {}  # job id -> connection
        self._completions: list[tuple[int, Reply]] = []

    # -- time ----------------------------------------------------------------------------

    def wall(self, t: float) -> float:
        """Wall-clock (``time.time``) seconds of monotonic time ``t``."""
        return t + self.wall_offset()

    def advance(self, now: float) -> None:
        """Run every device's simulation up to ``now``; finished jobs queue their replies."""
        for device in self.devices:
            self._finish(device, device.sim.advance(now))

    def next_wakeup(self) -> float | None:
        """Monotonic time of the next job completion on any device."""
        times = [t for d in self.devices if (t := d.sim.next_completion_time()) is not None]
        return min(times) if times else None

    def pop_completions(self) -> list[tuple[int, Reply]]:
        """Replies of blocking ops that finished, as ``(connection, reply)``, in order."""
        done, self._completions = self._completions, []
        return done

    def _finish(self, device: Device, jobs: list[Job]) -> None:
        for job in jobs:
            conn = self._job_owner.pop(job.id, None)
            ctx = self.contexts.get(conn) if conn is not None else None
            if conn is None or ctx is None:
                continue
            ctx.job = None
            assert job.finished is not None
            if job.kind is JobKind.KERNEL:
                reply: Reply = {
                    "ok": True,
                    "started": self.wall(job.started),
                    "ended": self.wall(job.finished),
                }
            else:
                reply = {"ok": True, "seconds": job.finished - job.started}
            self._completions.append((conn, reply))

    # -- requests ------------------------------------------------------------------------

    def handle(self, conn: int, pid: int, request: Request, now: float) -> Reply | None:
        """Apply one validated request; ``None`` means the reply comes when its job ends.

        Raises ``GpusimError`` without changing any state when the request cannot be done.
        """
        self.advance(now)
        op, args = request.op, request.args
        if op == "sample":
            return {"ok": True, **self.sample(now, args["since_us"])}
        if op == "status":
            return {"ok": True, **self.status(now)}
        if op == "context_create":
            return self._context_create(conn, pid, args["device"])
        ctx = self.contexts.get(conn)
        if ctx is None:
            raise GpusimError(errors.NO_CONTEXT, f"{op} needs a context: send context_create")
        device = self.devices[ctx.device]
        if op == "alloc":
            return self._alloc(device, ctx, args["bytes"])
        if op == "free":
            if ctx.allocations.pop(args["handle"], None) is None:
                raise GpusimError(
                    errors.INVALID_HANDLE, f"no allocation with handle {args['handle']}"
                )
            return {"ok": True}
        if op == "context_destroy":
            self.disconnect(conn, now)
            return {"ok": True}
        kind = JobKind(op)
        amount = args["work"] if kind is JobKind.KERNEL else args["bytes"]
        job, finished = device.sim.add_job(now, kind, amount, ctx.pid)
        self._finish(device, finished)
        ctx.job = job
        self._job_owner[job.id] = conn
        return None

    def _context_create(self, conn: int, pid: int, index: int) -> Reply:
        if conn in self.contexts:
            raise GpusimError(errors.CONTEXT_EXISTS, "this connection already has a context")
        if index >= len(self.devices):
            raise GpusimError(
                errors.INVALID_DEVICE, f"no device {index}; devices: 0..{len(self.devices) - 1}"
            )
        device = self.devices[index]
        base = self.config.context_memory_bytes
        self._check_free(device, base)
        ctx = Context(pid, index, base)
        self.contexts[conn] = ctx
        device.contexts[conn] = ctx
        return {"ok": True, "pid": pid, "device": index, "memory_bytes": base}

    def _alloc(self, device: Device, ctx: Context, size: int) -> Reply:
        self._check_free(device, size)
        handle = self._next_handle
        self._next_handle += 1
        ctx.allocations[handle] = size
        return {"ok": True, "handle": handle}

    @staticmethod
    def _check_free(device: Device, size: int) -> None:
        free = device.spec.memory_bytes - device.used_bytes
        if size > free:
            raise GpusimError(
                errors.OUT_OF_MEMORY,
                f"cannot allocate {size} bytes on device {device.spec.index}: "
                f"{free} of {device.spec.memory_bytes} free",
            )

    def disconnect(self, conn: int, now: float) -> None:
        """Drop the connection's context at once: its memory and any job in flight."""
        self.advance(now)
        ctx = self.contexts.pop(conn, None)
        if ctx is None:
            return
        device = self.devices[ctx.device]
        device.contexts.pop(conn, None)
        if ctx.job is not None:
            self._job_owner.pop(ctx.job.id, None)
            self._finish(device, device.sim.cancel(now, ctx.job))

    # -- queries -------------------------------------------------------------------------

    def sample(self, now: float, since_us: int) -> dict[str, Any]:
        """What NVML would report now (the ``sample`` op's reply, without ``ok``)."""
        return self._report(now, since_us, detailed=False)

    def status(self, now: float) -> dict[str, Any]:
        """``sample`` plus scales, per-process phase and running kernels."""
        report = self._report(now, 0, detailed=True)
        report.update(
            time_scale=self.config.time_scale,
            copy_time_scale=self.config.copy_time_scale,
            sample_period_s=self.config.sample_period_s,
            context_memory_bytes=self.config.context_memory_bytes,
        )
        return report

    def _report(self, now: float, since_us: int, detailed: bool) -> dict[str, Any]:
        self.advance(now)
        offset = self.wall_offset()
        period = self.config.sample_period_s
        since = since_us / 1e6 - offset
        devices = []
        for device in self.devices:
            last_kernel = device.usage.kernel_pids_since(since)
            # Like NVML's samples: each process's share over the period ending when it
            # last ran a kernel (now, for one still running).
            usage = device.usage
            samples = [
                {
                    "pid": pid,
                    "timestamp_us": int((last + offset) * 1e6),
                    "sm_ratio": usage.sm_ratio(pid, last - period, last),
                    "mem_ratio": usage.copy_ratio(pid, last - period, last),
                }
                for pid, last in last_kernel.items()
            ]
            devices.append(
                {
                    "index": device.spec.index,
                    "uuid": device.spec.uuid,
                    "name": device.spec.name,
                    "memory_total_bytes": device.spec.memory_bytes,
                    "memory_used_bytes": device.used_bytes,
                    "utilization_ratio": device.usage.utilization(now - period, now),
                    "processes": _processes(device, detailed),
                    "process_samples": samples,
                }
            )
        return {"timestamp_us": int((now + offset) * 1e6), "devices": devices}


def _processes(device: Device, detailed: bool) -> list[dict[str, Any]]:
    """Compute processes of a device, one entry per host PID (NVML lists a PID once)."""
    by_pid: dict[int, dict[str, Any]] = {}
    for ctx in device.contexts.values():
        entry = by_pid.setdefault(ctx.pid, {"pid": ctx.pid, "used_memory_bytes": 0})
        entry["used_memory_bytes"] += ctx.used_bytes
        if detailed:
            entry.setdefault("phase", "idle")
            entry.setdefault("kernels_running", 0)
            if ctx.phase != "idle":
                entry["phase"] = ctx.phase
            entry["kernels_running"] += int(ctx.phase == "kernel")
    return list(by_pid.values())
