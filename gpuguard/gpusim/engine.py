"""One engine: a whole GPU or one MIG instance, with its contexts and their streams.

Each context has one stream, executed in order like CUDA's default stream: kernels launched
asynchronously wait in it (at most ``queue_depth`` of them; a launch into a full queue is
answered only once a slot frees, as cudaLaunchKernel blocks), and blocking ops (a copy, a
synchronous kernel, ``synchronize``) wait behind them. Only the stream's head runs on the
contention simulator, and the next op starts at the exact time the head finished, so a
process that stops sending (frozen) keeps the device busy until its queue has drained.
Replies to ops a client waits for are appended to a shared list as ``(connection, reply)``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuguard.gpusim.contention import ContentionSimulator, Job, JobKind
from gpuguard.gpusim.usage import UsageHistory

Reply = dict[str, Any]

#: Finished events kept for the next ``synchronize`` reply (oldest dropped beyond this).
MAX_UNREPORTED_EVENTS = 4096


class OpKind(StrEnum):
    """What a stream op does: occupy a resource (kernel, copy) or mark a point (event, sync)."""

    KERNEL = "kernel"
    COPY_IN = "copy_in"
    COPY_OUT = "copy_out"
    EVENT = "event"
    SYNC = "sync"


_JOB_KINDS = {OpKind.KERNEL: JobKind.KERNEL, OpKind.COPY_IN: JobKind.COPY_IN}
_JOB_KINDS[OpKind.COPY_OUT] = JobKind.COPY_OUT


@dataclass(eq=False)
class StreamOp:
    """One op in a context's stream; ``blocking`` ops are answered when they finish."""

    kind: OpKind
    amount: float = 0.0  # device-seconds of a kernel, bytes of a copy
    blocking: bool = False
    event_id: int = 0
    job: Job | None = None


@dataclass(eq=False)
class Context:
    """One process's context on one engine (one per connection)."""

    conn: int
    pid: int
    base_bytes: int
    allocations: dict[int, int] = field(default_factory=dict)
    stream: deque[StreamOp] = field(default_factory=deque)
    queued: int = 0  # asynchronous ops (launches, events) in the stream
    held: StreamOp | None = None  # a launch waiting for room in a full queue
    events_done: deque[tuple[int, float]] = field(
        default_factory=lambda: deque(maxlen=MAX_UNREPORTED_EVENTS)
    )
    next_event: int = 1

    @property
    def used_bytes(self) -> int:
        return self.base_bytes + sum(self.allocations.values())

    @property
    def running(self) -> StreamOp | None:
        """The op on the device now, if any."""
        head = self.stream[0] if self.stream else None
        return head if head is not None and head.job is not None else None

    @property
    def kernels_queued(self) -> int:
        """Kernels launched and not finished (the running one included)."""
        return sum(op.kind is OpKind.KERNEL for op in self.stream)


@dataclass(eq=False)
class Engine:
    """A schedulable device: its own simulator, usage history, memory and contexts."""

    index: int
    mig_index: int | None
    uuid: str
    name: str
    memory_bytes: int
    sim: ContentionSimulator
    usage: UsageHistory
    queue_depth: int
    reply: Callable[[int, Reply], None]
    wall: Callable[[float], float]
    contexts: dict[int, Context] = field(default_factory=dict)  # by connection
    _owner: dict[Job, Context] = field(default_factory=dict)

    @property
    def address(self) -> str:
        """``0``, or ``0:1`` for MIG instance 1 of GPU 0 (NVIDIA_VISIBLE_DEVICES' form)."""
        return str(self.index) if self.mig_index is None else f"{self.index}:{self.mig_index}"

    @property
    def used_bytes(self) -> int:
        return sum(ctx.used_bytes for ctx in self.contexts.values())

    def free_bytes(self) -> int:
        return self.memory_bytes - self.used_bytes

    def advance(self, now: float) -> None:
        """Run to ``now`` one completion at a time, starting each stream's next op on time."""
        while (t := self.sim.next_completion_time()) is not None and t <= now:
            for job in self.sim.advance(t):
                self._finished(job, t)
        self.sim.advance(now)

    def submit(self, ctx: Context, op: StreamOp, now: float) -> Reply | None:
        """Append ``op`` to the context's stream; the reply now, or None if it comes later."""
        if not op.blocking and ctx.queued >= self.queue_depth:
            ctx.held = op  # the client's launch call blocks until a slot frees
            return None
        self._append(ctx, op)
        self._run_stream(ctx, now)
        return None if op.blocking else self._accepted(ctx, op)

    def synchronize(self, ctx: Context, now: float) -> Reply | None:
        """``synchronize``: answered at once on an idle stream, else when it drains."""
        if not ctx.stream:
            return self._sync_reply(ctx)
        return self.submit(ctx, StreamOp(OpKind.SYNC, blocking=True), now)

    def remove(self, conn: int, now: float) -> Context | None:
        """Drop a connection's context at once: memory, queued ops and the running one."""
        ctx = self.contexts.pop(conn, None)
        if ctx is None:
            return None
        running = ctx.running
        if running is not None and running.job is not None:
            self._owner.pop(running.job, None)
            for job in self.sim.cancel(now, running.job):
                self._finished(job, job.finished if job.finished is not None else now)
        ctx.stream.clear()
        ctx.held = None
        return ctx

    # -- stream mechanics ----------------------------------------------------------------

    def _append(self, ctx: Context, op: StreamOp) -> None:
        ctx.stream.append(op)
        if not op.blocking:
            ctx.queued += 1

    def _accepted(self, ctx: Context, op: StreamOp) -> Reply:
        reply: Reply = {"ok": True, "queued": ctx.queued}
        if op.kind is OpKind.EVENT:
            reply["event"] = op.event_id
        return reply

    def _sync_reply(self, ctx: Context) -> Reply:
        events = [{"id": i, "t": self.wall(t)} for i, t in ctx.events_done]
        ctx.events_done.clear()
        return {"ok": True, "events": events}

    def _finished(self, job: Job, t: float) -> None:
        ctx = self._owner.pop(job, None)
        if ctx is None:
            return
        op = self._pop(ctx)
        if op.blocking and op.kind is OpKind.KERNEL:
            self.reply(
                ctx.conn, {"ok": True, "started": self.wall(job.started), "ended": self.wall(t)}
            )
        elif op.blocking:
            self.reply(ctx.conn, {"ok": True, "seconds": t - job.started})
        self._run_stream(ctx, t)

    def _pop(self, ctx: Context) -> StreamOp:
        op = ctx.stream.popleft()
        if not op.blocking:
            ctx.queued -= 1
        return op

    def _run_stream(self, ctx: Context, t: float) -> None:
        """Admit a held launch if there is room, pass markers, start the head op."""
        while True:
            if ctx.held is not None and ctx.queued < self.queue_depth:
                held, ctx.held = ctx.held, None
                self._append(ctx, held)
                self.reply(ctx.conn, self._accepted(ctx, held))
            if not ctx.stream or ctx.stream[0].job is not None:
                return
            head = ctx.stream[0]
            job_kind = _JOB_KINDS.get(head.kind)
            if job_kind is not None:
                head.job, finished = self.sim.add_job(t, job_kind, head.amount, ctx.pid)
                self._owner[head.job] = ctx
                for job in finished:  # none: the simulator is already at t
                    self._finished(job, t)
                return
            self._pop(ctx)
            if head.kind is OpKind.EVENT:
                ctx.events_done.append((head.event_id, t))
            else:
                self.reply(ctx.conn, self._sync_reply(ctx))
