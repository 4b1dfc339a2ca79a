"""Settling the journal against the container engine and the exporter's state, and
``--max-pause``.

The engine (Docker, containerd) is the truth about what is paused: a container gone or
unpaused behind our back is forgotten, one whose reason is gone is resumed
(``plan_reconcile``); a pause older than ``--max-pause`` is undone for good. When the
journal was unreadable at start, every managed container the engine shows paused is resumed
once it answers. Whether the engine answers is kept here too (the health check's ``docker
engine unreachable``).

Not thread-safe: the controller calls it under its lock; actions go through ``execute``
(the controller's, so they are counted and reported like every other).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.decision import UNPAUSE, Decision, Step
from gpuguard.actuator.errors import EngineDown
from gpuguard.actuator.execution.executor import PauseExecutor
from gpuguard.actuator.safety.journal import Journal, plan_reconcile
from gpuguard.actuator.safety.resume import resume_managed_paused
from gpuguard.actuator.state import ExporterState
from gpuguard.contract import StepReason, TriggerSource

log = logging.getLogger("gpuguard.actuator")

Execute = Callable[[Decision, TriggerSource], object]


class Reconciler:
    """Brings the journal in line with the engine; enforces the maximum pause."""

    def __init__(
        self,
        executor: PauseExecutor,
        journal: Journal,
        audit: AuditLog,
        max_pause_s: float,
        execute: Execute,
        journal_lost: str | None = None,
    ) -> None:
        self.executor = executor
        self.journal = journal
        self.audit = audit
        self.max_pause_s = max_pause_s
        self.execute = execute
        #: set when the journal was unreadable: undo every managed pause once the engine
        #: answers
        self.journal_lost = journal_lost or journal.lost
        #: why the engine did not answer, until it does again
        self.engine_error: str | None = None

    def engine_failed(self, detail: str) -> None:
        """An action found the engine unreachable."""
        self.engine_error = detail

    def enforce_max_pause(self) -> None:
        """Resume, for good, whatever has been paused longer than ``--max-pause``."""
        now = time.time()
        for entry in list(self.journal.paused.values()):
            if self.journal.clock.paused_for(entry) <= self.max_pause_s:
                continue
            log.warning("%s paused longer than --max-pause: resuming it for good", entry.name)
            if entry.task_id:
                self.journal.exempt(entry.task_id, now)
            action = Step(
                UNPAUSE,
                entry.container_id,
                entry.name,
                StepReason.MAX_PAUSE,
                entry.gpu,
                entry.task_id,
            )
            self.execute(Decision((action,)), TriggerSource.RECONCILE)

    def reconcile(self, state: ExporterState | None) -> None:
        """Settle the journal against the engine: forget what is gone, resume what must go."""
        try:
            self.executor.check()
            engine_view = self.executor.paused_states(list(self.journal.paused))
            if self.journal_lost:
                self._undo_managed_pauses()
        except EngineDown as exc:
            if self.engine_error is None:
                log.warning("%s engine unreachable, retrying: %s", self.executor.engine.name, exc)
            self.engine_error = str(exc)
            return
        if self.engine_error is not None:
            log.info("%s engine answers again", self.executor.engine.name)
            self.engine_error = None
        with_tasks = (
            None if state is None else {t.container_id for t in state.tasks if t.container_id}
        )
        steps = plan_reconcile(
            self.journal.paused,
            engine_view,
            with_tasks,
            self.journal.clock.paused_for,
            self.max_pause_s,
        )
        forget = [step for step in steps if step.verdict == "forget"]
        self.journal.forget(step.container_id for step in forget)  # one write for them all
        for step in forget:
            self.audit.write(
                "reconcile", container_id=step.container_id, verdict="forget", why=step.why
            )
        for step in steps:
            if step.verdict == "unpause":
                entry = self.journal.paused[step.container_id]
                action = Step(
                    UNPAUSE,
                    entry.container_id,
                    entry.name,
                    StepReason.RECONCILE,
                    entry.gpu,
                    entry.task_id,
                )
                self.execute(Decision((action,)), TriggerSource.RECONCILE)
        if state is not None:
            self.journal.prune({t.task_id for t in state.tasks}, {c.id for c in state.containers})

    def _undo_managed_pauses(self) -> None:
        """The journal was unreadable: resume every managed container the engine shows paused
        (``resume_managed_paused`` says why that is the safe reading)."""
        resumed = resume_managed_paused(
            self.executor.engine,
            self.audit,
            f"journal unreadable: {self.journal_lost}",
            self.executor.freezer,
        )
        log.warning(
            "journal was unreadable: resumed %d paused managed container(s): %s",
            len(resumed), ", ".join(c[:12] for c in resumed) or "none",
        )  # fmt: skip
        self.journal_lost = None
        self.journal.set_lost(None)
