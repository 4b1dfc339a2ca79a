"""The simulated GPUs' state: engines (GPUs and MIG instances), contexts, requests, reports.

No sockets and no clock of its own: the daemon passes ``now`` (monotonic seconds) into every
call, so this is the whole of the daemon's behaviour in a form a test can drive directly.
A connection is a number and holds at most one context; a process that wants two devices
opens two connections (both carry its PID). An op the client waits for (a copy, a
synchronous kernel, ``synchronize``, a launch into a full queue) returns no reply at once;
its reply comes out of ``pop_completions`` when it is done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuguard.gpusim import errors
from gpuguard.gpusim.config import DaemonConfig, DeviceSpec
from gpuguard.gpusim.contention import ContentionSimulator
from gpuguard.gpusim.engine import Context, Engine, OpKind, Reply, StreamOp
from gpuguard.gpusim.errors import GpusimError
from gpuguard.gpusim.protocol import Request
from gpuguard.gpusim.report import report
from gpuguard.gpusim.usage import UsageHistory

# Usage history kept per engine; long enough for any poller, short enough to stay small.
_HISTORY_S = 10.0
_COPY_KINDS = {"copy_in": OpKind.COPY_IN, "copy_out": OpKind.COPY_OUT}


class SimulatedGpu:
    """All devices of one daemon and the requests that act on them."""

    def __init__(self, config: DaemonConfig, now: float, wall_offset: Callable[[], float]) -> None:
        self.config = config
        self.wall_offset = wall_offset
        self.engines: list[Engine] = []
        self._by_address: dict[str, Engine] = {}
        for spec in config.devices:
            if spec.mig:
                for mig_index, mig in enumerate(spec.mig):
                    name = f"{spec.name} MIG {mig.profile}"
                    uuid = spec.mig_uuid(mig_index)
                    memory, fraction = mig.memory_bytes, mig.compute_fraction
                    self._add_engine(spec, mig_index, uuid, name, memory, fraction, now)
            else:
                self._add_engine(spec, None, spec.uuid, spec.name, spec.memory_bytes, 1.0, now)
        self.contexts: dict[int, Context] = {}  # by connection
        self._engine_of: dict[int, Engine] = {}  # by connection
        self._next_handle = 1
        self._completions: list[tuple[int, Reply]] = []

    def _add_engine(
        self,
        spec: DeviceSpec,
        mig: int | None,
        uuid: str,
        name: str,
        memory: int,
        compute_fraction: float,
        now: float,
    ) -> None:
        config, profile = self.config, self.config.profile
        usage = UsageHistory(max(_HISTORY_S, 4 * config.sample_period_s))
        sim = ContentionSimulator(
            time_scale=config.time_scale,
            copy_time_scale=config.copy_time_scale,
            copy_in_bytes_per_s=profile.copy_in_bytes_per_s,
            copy_out_bytes_per_s=profile.copy_out_bytes_per_s,
            concurrent_kernel_s=profile.concurrent_kernel_s,
            compute_fraction=compute_fraction,
            now=now,
            on_segment=usage.record,
        )
        engine = Engine(
            spec.index, mig, uuid, name, memory, sim, usage, config.launch_queue_depth,
            reply=lambda conn, reply: self._completions.append((conn, reply)),
            wall=self.wall,
        )  # fmt: skip
        self.engines.append(engine)
        self._by_address[engine.address] = self._by_address[uuid] = engine

    # -- time ----------------------------------------------------------------------------

    def wall(self, t: float) -> float:
        """Wall-clock (``time.time``) seconds of monotonic time ``t``."""
        return t + self.wall_offset()

    def advance(self, now: float) -> None:
        """Run every engine up to ``now``; finished ops queue their replies."""
        for engine in self.engines:
            engine.advance(now)

    def next_wakeup(self) -> float | None:
        """Monotonic time of the next job completion on any engine."""
        times = [t for e in self.engines if (t := e.sim.next_completion_time()) is not None]
        return min(times) if times else None

    def pop_completions(self) -> list[tuple[int, Reply]]:
        """Replies of ops that finished, as ``(connection, reply)``, in order."""
        done, self._completions = self._completions, []
        return done

    # -- requests ------------------------------------------------------------------------

    def handle(self, conn: int, pid: int, request: Request, now: float) -> Reply | None:
        """Apply one validated request; ``None`` means its reply comes later.

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
        engine = self._engine_of[conn]
        if op == "alloc":
            return self._alloc(engine, ctx, args["bytes"])
        if op == "free":
            if ctx.allocations.pop(args["handle"], None) is None:
                raise GpusimError(
                    errors.INVALID_HANDLE, f"no allocation with handle {args['handle']}"
                )
            return {"ok": True}
        if op == "context_destroy":
            self.disconnect(conn, now)
            return {"ok": True}
        if op == "synchronize":
            return engine.synchronize(ctx, now)
        return engine.submit(ctx, self._stream_op(ctx, op, args), now)

    def _stream_op(self, ctx: Context, op: str, args: dict[str, Any]) -> StreamOp:
        if op in _COPY_KINDS:
            return StreamOp(_COPY_KINDS[op], float(args["bytes"]), blocking=True)
        if op == "event_record":
            ctx.next_event += 1
            return StreamOp(OpKind.EVENT, event_id=ctx.next_event - 1)
        work = args["work"] if "work" in args else args["flops"] / self.config.profile.flops_per_s
        return StreamOp(OpKind.KERNEL, work, blocking=op == "kernel")

    def resolve(self, address: str) -> Engine:
        """The engine at a device address; ``invalid_device`` names what exists."""
        engine = self._by_address.get(address)
        if engine is not None:
            return engine
        for spec in self.config.devices:
            if spec.mig and address in (str(spec.index), spec.uuid):
                raise GpusimError(
                    errors.INVALID_DEVICE,
                    f"GPU {spec.index} is in MIG mode: use one of its MIG devices "
                    f"({', '.join(f'{spec.index}:{i}' for i in range(len(spec.mig)))})",
                )
        known = ", ".join(e.address for e in self.engines)
        raise GpusimError(errors.INVALID_DEVICE, f"no device {address}; devices: {known}")

    def _context_create(self, conn: int, pid: int, address: str) -> Reply:
        if conn in self.contexts:
            raise GpusimError(errors.CONTEXT_EXISTS, "this connection already has a context")
        engine = self.resolve(address)
        base = self.config.context_memory_bytes
        self._check_free(engine, base)
        ctx = Context(conn, pid, base)
        self.contexts[conn] = engine.contexts[conn] = ctx
        self._engine_of[conn] = engine
        return {
            "ok": True,
            "pid": pid,
            "device": engine.address,
            "uuid": engine.uuid,
            "memory_bytes": base,
        }

    def _alloc(self, engine: Engine, ctx: Context, size: int) -> Reply:
        self._check_free(engine, size)
        handle = self._next_handle
        self._next_handle += 1
        ctx.allocations[handle] = size
        return {"ok": True, "handle": handle}

    @staticmethod
    def _check_free(engine: Engine, size: int) -> None:
        free = engine.free_bytes()
        if size > free:
            raise GpusimError(
                errors.OUT_OF_MEMORY,
                f"cannot allocate {size} bytes on device {engine.address}: "
                f"{free} of {engine.memory_bytes} free",
            )

    def disconnect(self, conn: int, now: float) -> None:
        """Drop the connection's context at once: its memory and every op it queued."""
        self.advance(now)
        self.contexts.pop(conn, None)
        engine = self._engine_of.pop(conn, None)
        if engine is not None:
            engine.remove(conn, now)

    # -- queries -------------------------------------------------------------------------

    def sample(self, now: float, since_us: int) -> dict[str, Any]:
        """What NVML would report now (the ``sample`` op's reply, without ``ok``)."""
        self.advance(now)
        return report(self.config, self.engines, self.wall_offset(), now, since_us, False)

    def status(self, now: float) -> dict[str, Any]:
        """``sample`` plus the profile, scales, queues and each process's phase."""
        self.advance(now)
        config = self.config
        status = report(config, self.engines, self.wall_offset(), now, 0, detailed=True)
        status.update(
            profile=config.profile.name,
            time_scale=config.time_scale,
            copy_time_scale=config.copy_time_scale,
            sample_period_s=config.sample_period_s,
            context_memory_bytes=config.context_memory_bytes,
            launch_queue_depth=config.launch_queue_depth,
        )
        return status
