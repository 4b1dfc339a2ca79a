"""Handing a container frozen through its cgroup to the runtime's own pause, in the background.

``docker pause`` or containerd's task pause (runc: 13-100 ms a container) then shows it paused
and an operator's unpause resumes it. A best-effort container frozen for real-time work's
busy edge or duty cycle (``BRIEF``) is handed over once the freeze has lasted
``HANDOVER_AFTER_S``: thawed sooner, as most are, it is never told to the runtime, so its thaw
is a cgroup write, not the runtime's unpause. Any other pause is handed over at once.
Anything that comes next for that container waits for its hand-over first (``settle``); an
unpause drops one not yet begun. Each hand-over writes its own audit record
(``runtime_pause``) and never raises.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor

from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.decision import Step
from gpuguard.actuator.engine.freezer import Cgroup, CgroupGone, ContainerFreezer, FreezerError
from gpuguard.actuator.errors import EngineError
from gpuguard.contract import Result, StepReason

log = logging.getLogger("gpuguard.actuator")

#: how a pause was taken (the audit record's ``method``): frozen through its cgroup, or the
#: runtime's own pause (``docker pause``, containerd's task pause: the record's ``engine``);
#: a ``runtime_pause`` record also follows a cgroup freeze once the runtime is told
CGROUP, RUNTIME_PAUSE = "cgroup", "runtime_pause"
#: hand-overs to the runtime at once: each runs runc; more at once only share the same cores with
#: the exporter and this actuator's next decision (the frozen containers wait either way)
HANDOVER_WORKERS = 2
#: how long a freeze lasts before the runtime is told: shorter ones are thawed through the
#: cgroup alone (the runtime's unpause, 13-100 ms a container under the controller's lock,
#: held a busy edge's freezes up behind a duty cycle's thaws)
HANDOVER_AFTER_S = 0.5
#: the pauses handed over after ``HANDOVER_AFTER_S``: a best-effort container's, for real-time
#: work's busy edges and duty cycles, mostly thawed within a gap between requests
BRIEF = frozenset({StepReason.BEST_EFFORT, StepReason.DUTY_CYCLE})


class Handovers:
    """The hand-overs to the runtime pending or running, by container id; thread-safe.

    ``runtime_pause(container_id)`` pauses the (thawed, stopped) container through the
    engine; ``gone(container_id)`` is told when the container went away meanwhile.
    """

    def __init__(
        self,
        engine_name: str,
        freezer: ContainerFreezer,
        audit: AuditLog,
        runtime_pause: Callable[[str], None],
        gone: Callable[[str], None],
        after_s: float = HANDOVER_AFTER_S,
    ) -> None:
        self.engine_name = engine_name
        self.freezer = freezer
        self.audit = audit
        self._runtime_pause = runtime_pause
        self._gone = gone
        self.after_s = after_s
        self._pending: dict[str, Future[None]] = {}
        self._lock = threading.Condition()
        self._pool: ThreadPoolExecutor | None = None
        #: hand-overs waiting for their freeze to last ``after_s``: (due, seq, future, ...)
        self._due: list[tuple[float, int, Future[None], Step, Cgroup]] = []
        self._seq = 0
        self._scheduler: threading.Thread | None = None

    def begin(self, action: Step, cgroup: Cgroup) -> None:
        """Hand the frozen container of ``action`` to the runtime, in the background: at once,
        or for a ``BRIEF`` pause once its freeze has lasted ``after_s``."""
        cid = action.container_id
        future: Future[None] = Future()
        with self._lock:
            self._pending[cid] = future
            if action.reason not in BRIEF or self.after_s <= 0:
                self._submit(future, action, cgroup)
            else:
                self._seq += 1
                due = time.monotonic() + self.after_s
                heapq.heappush(self._due, (due, self._seq, future, action, cgroup))
                if self._scheduler is None:
                    self._scheduler = threading.Thread(
                        target=self._schedule, name="handover-due", daemon=True
                    )
                    self._scheduler.start()
                self._lock.notify()
        future.add_done_callback(lambda done: self._finished(cid, done))

    def _submit(self, future: Future[None], action: Step, cgroup: Cgroup) -> None:
        """Start a hand-over now (the caller holds the lock)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=HANDOVER_WORKERS, thread_name_prefix="handover"
            )
        self._pool.submit(self._run, future, action, cgroup)

    def _schedule(self) -> None:
        """Start each hand-over when due (one dropped meanwhile is cancelled: skipped)."""
        while True:
            with self._lock:
                while not self._due or self._due[0][0] > time.monotonic():
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    self._lock.wait(wait)
                _, _, future, action, cgroup = heapq.heappop(self._due)
                if not future.cancelled():
                    self._submit(future, action, cgroup)

    def _run(self, future: Future[None], action: Step, cgroup: Cgroup) -> None:
        if future.set_running_or_notify_cancel():
            self._hand_over(action, cgroup)
            future.set_result(None)

    def _finished(self, container_id: str, future: Future[None]) -> None:
        with self._lock:
            if self._pending.get(container_id) is future:
                del self._pending[container_id]

    def settle(self, container_id: str, cancel: bool) -> bool:
        """Wait for the container's hand-over to the runtime, or drop it if not begun: True
        when one was dropped (the runtime was never told: its cgroup alone holds it)."""
        with self._lock:
            future = self._pending.get(container_id)
        if future is None:
            return False
        if cancel and future.cancel():
            self.audit.write(
                RUNTIME_PAUSE, engine=self.engine_name, container_id=container_id,
                result="cancelled",
                detail=f"resumed before {self.engine_name} was told: frozen in its cgroup only",
            )  # fmt: skip
            return True
        if not cancel:
            self._hurry({container_id})
        _wait(future)  # it never raises: _hand_over audits its own failures
        return False

    def settle_all(self) -> None:
        """Begin every hand-over now, and wait for them (tests, benchmarks, shutdown)."""
        with self._lock:
            pending = list(self._pending.values())
        self._hurry(None)
        for future in pending:
            _wait(future)

    def _hurry(self, container_ids: set[str] | None) -> None:
        """Make these hand-overs (None: all) due now."""
        with self._lock:
            self._due = [
                (0.0, seq, future, action, cgroup)
                if container_ids is None or action.container_id in container_ids
                else (due, seq, future, action, cgroup)
                for due, seq, future, action, cgroup in self._due
            ]
            heapq.heapify(self._due)
            self._lock.notify()

    def running(self) -> set[str]:
        """Containers being handed over now: the engine may show them running, yet they
        are held (between the hand-over's thaw and runc's freeze)."""
        with self._lock:
            return {cid for cid, f in self._pending.items() if not f.done()}

    def _hand_over(self, action: Step, cgroup: Cgroup) -> None:
        """The container is frozen: let the runtime pause it too, so its state says so."""
        cid = action.container_id
        began = time.time()
        result, detail = Result.OK, ""
        try:
            self.freezer.handover(cgroup, lambda: self._runtime_pause(cid))
        except CgroupGone:
            self._gone(cid)
            result, detail = Result.SKIPPED, "container is gone"
        except (FreezerError, EngineError) as exc:
            result, detail = Result.FAILED, f"frozen in its cgroup only: {exc}"
        except Exception as exc:  # a background thread: never lose what happened
            log.exception("hand-over of %s to %s failed", action.container, self.engine_name)
            result, detail = Result.FAILED, f"frozen in its cgroup only: {exc!r}"
        if result == Result.FAILED:
            log.warning("%s: the runtime's pause failed, %s", action.container, detail)
        self.audit.write(
            RUNTIME_PAUSE,
            engine=self.engine_name,
            container_id=cid,
            container=action.container,
            result=result,
            detail=detail or None,
            started=began,
            finished=time.time(),
        )


def _wait(future: Future[None]) -> None:
    """Wait for a hand-over; one dropped meanwhile is done with."""
    try:
        future.result()
    except CancelledError:
        pass
