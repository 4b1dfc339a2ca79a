"""Handing a container frozen through its cgroup to the runtime's own pause, in the background.

``docker pause`` or containerd's task pause (runc: 13-100 ms a container) then shows it paused
and an operator's unpause resumes it. Anything that comes next for that container waits for
its hand-over first (``settle``); an unpause drops one not yet begun. Each hand-over writes
its own audit record (``runtime_pause``) and never raises.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.decision import Step
from gpuguard.actuator.engine.freezer import Cgroup, CgroupGone, ContainerFreezer, FreezerError
from gpuguard.actuator.errors import EngineError
from gpuguard.contract import Result

log = logging.getLogger("gpuguard.actuator")

#: how a pause was taken (the audit record's ``method``): frozen through its cgroup, or the
#: runtime's own pause (``docker pause``, containerd's task pause: the record's ``engine``);
#: a ``runtime_pause`` record also follows a cgroup freeze once the runtime is told
CGROUP, RUNTIME_PAUSE = "cgroup", "runtime_pause"
#: hand-overs to the runtime at once: each runs runc; more at once only share the same cores with
#: the exporter and this actuator's next decision (the frozen containers wait either way)
HANDOVER_WORKERS = 2


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
    ) -> None:
        self.engine_name = engine_name
        self.freezer = freezer
        self.audit = audit
        self._runtime_pause = runtime_pause
        self._gone = gone
        self._pending: dict[str, Future[None]] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def begin(self, action: Step, cgroup: Cgroup) -> None:
        """Hand the frozen container of ``action`` to the runtime, in the background."""
        cid = action.container_id
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=HANDOVER_WORKERS, thread_name_prefix="handover"
                )
            future = self._pool.submit(self._hand_over, action, cgroup)
            self._pending[cid] = future
        future.add_done_callback(lambda done: self._finished(cid, done))

    def _finished(self, container_id: str, future: Future[None]) -> None:
        with self._lock:
            if self._pending.get(container_id) is future:
                del self._pending[container_id]

    def settle(self, container_id: str, cancel: bool) -> None:
        """Wait for the container's hand-over to the runtime, or drop it if not begun."""
        with self._lock:
            future = self._pending.get(container_id)
        if future is None:
            return
        if cancel and future.cancel():
            self.audit.write(
                RUNTIME_PAUSE, engine=self.engine_name, container_id=container_id,
                result="cancelled",
                detail=f"resumed before {self.engine_name} was told: frozen in its cgroup only",
            )  # fmt: skip
            return
        future.result()  # it never raises: _hand_over audits its own failures

    def settle_all(self) -> None:
        """Wait for every hand-over begun so far."""
        with self._lock:
            pending = list(self._pending.values())
        for future in pending:
            if not future.cancelled():
                future.result()

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
