"""``gpuguard guard``: resume what the actuator paused when the actuator cannot.

Every half second: actuator gone (the journal's ``flock`` is free) -> resume what the journal
names paused and forget them; stuck (its lease not renewed within ``--lease.timeout``) ->
resume them, journal untouched; alive -> enforce ``--max-pause``. Resumes come before any
write; it never pauses, and touches only containers the journal names (with an unreadable
journal: managed ones). Why: docs/design-notes.md, "The guard".
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import signal
import threading
import time
from typing import Any

from gpuguard import flags
from gpuguard.actuator.audit import AUDIT_FILE, AuditLog
from gpuguard.actuator.engine import open_engine
from gpuguard.actuator.engine.base import Answer, ContainerEngine, attempt
from gpuguard.actuator.engine.freezer import ContainerFreezer
from gpuguard.actuator.errors import EngineDown
from gpuguard.actuator.guard.config import FLAGS, GuardConfig, validate
from gpuguard.actuator.guard.metrics import Seen, guard_server
from gpuguard.actuator.safety import lease
from gpuguard.actuator.safety.journal import (
    JOURNAL_FILE,
    Journal,
    JournalContent,
    JournalCorrupt,
    PausedEntry,
    load,
    set_aside,
)
from gpuguard.actuator.safety.journallock import JournalLock
from gpuguard.actuator.safety.pauseclock import PauseClock, host_clock
from gpuguard.actuator.safety.resume import resume_container, resume_managed_paused
from gpuguard.contract import Result, SkipReason
from gpuguard.web.webconfig import WebConfigWatcher

log = logging.getLogger("gpuguard.guard")

CHECK_PERIOD_S = 0.5


class Guard:
    """One ``check()`` per period; every engine or journal failure is retried next time."""

    def __init__(
        self,
        config: GuardConfig,
        engine: ContainerEngine,
        audit: AuditLog,
        clock: PauseClock | None = None,
    ) -> None:
        self.config = config
        #: --max-pause is judged on the boot clock (``pauseclock``), never on wall time
        self.clock = clock or host_clock()
        self.engine = engine
        self.audit = audit
        # A pause is a cgroup freeze before the engine hears of it: a crash in between
        # leaves one only the cgroup shows, and the guard thaws that too.
        self.freezer = ContainerFreezer(config.procfs, config.sysfs)
        #: the state directory's failed writes, shared with the audit log (guard metrics)
        self.writes = audit.writes
        self.lock = JournalLock(config.state_dir, self.writes)
        self.journal_path = config.state_dir / JOURNAL_FILE
        self.verdict = ""
        # (container id, paused_at) resumed while the journal was not ours to write: done
        # once, not on every check, for as long as the journal keeps naming it.
        self._resumed: set[tuple[str, float]] = set()
        self._engine_down = False
        self._lockless = False  # journal.lock could not even be opened at the last check
        self.seen = Seen()

    def check(self) -> str:
        """Look at the actuator and do what its state calls for, then renew the guard's
        lease (a resume never waits for a write); returns the verdict."""
        self.seen.last_check = time.time()
        held = lease.read_actuator(self.config.state_dir)
        self.seen.actuator_lease_age_s = math.inf if held is None else held.age()
        left: JournalContent | None = None
        if self._take_lock():
            verdict = "gone"
            try:
                left = self._read_left_behind()
            finally:
                # The engine may take seconds per call (or hang until its timeout): never
                # keep a restarted actuator waiting for the lock that long.
                self.lock.release()
            self._take_over(left)
        else:
            stuck = held is None or held.age() > self.config.lease_timeout_s
            verdict = "stuck" if stuck else "alive"
            self._watch(resume_all=stuck)
        if verdict != self.verdict:
            self.verdict = verdict  # the metric says it no later than the log and the audit
            self._announce(verdict, left)
        lease.renew(self.config.state_dir / lease.GUARD_LEASE, self.writes)
        return verdict

    def _take_lock(self) -> bool:
        """Take the journal's lock if nobody holds it; False also where there is no lock
        file to take (then the actuator's lease alone says whether it lives)."""
        try:
            taken = self.lock.try_acquire()
        except OSError as exc:
            self.writes.failed("lock", self.lock.path, exc)
            self._lockless = True
            return False
        self._lockless = False
        return taken

    def _announce(self, verdict: str, left: JournalContent | None) -> None:
        if verdict == "alive":
            log.info("actuator alive: enforcing --max-pause %gs", self.config.max_pause_s)
        elif verdict == "gone" and left is not None and not left.paused and left.lost is None:
            # every start (the guard first) and every stop: nothing is wrong
            log.info("no actuator holds the journal, and it names nothing paused")
        elif verdict == "gone":
            log.warning("no actuator holds the journal: resuming what it left paused")
        elif self._lockless:
            log.warning(
                "journal.lock cannot be taken and the actuator's lease is over %gs old: "
                "resuming everything it paused", self.config.lease_timeout_s,
            )  # fmt: skip
        else:
            log.warning(
                "actuator holds the journal but its lease is over %gs old: resuming everything "
                "it paused", self.config.lease_timeout_s,
            )  # fmt: skip
        self.audit.write("guard", verdict=verdict)

    def _read_left_behind(self) -> JournalContent:
        """What a gone actuator left (the journal is ours while we hold its lock). One that
        cannot be trusted is moved aside and replaced by its valid part, marked ``lost``:
        every managed pause is undone, by us or by the next actuator, until it is done."""
        try:
            return load(self.journal_path)
        except JournalCorrupt as exc:
            content = exc.salvaged or JournalContent()
            try:
                kept = set_aside(self.journal_path)
            except OSError as err:  # read-only: resume by it, at every check, in memory
                if "journal" not in self.writes.failing():
                    log.error("JOURNAL UNREADABLE: %s; cannot move it aside", exc)
                self.writes.failed("journal", self.journal_path, err)
                content.lost = f"journal unreadable ({exc})"
                return content
            log.error("JOURNAL UNREADABLE: %s; moved to %s", exc, kept)
            self.audit.write("journal_unreadable", detail=f"{exc}; kept as {kept.name}")
            content.lost = f"journal unreadable ({exc}); kept as {kept.name}"
            Journal(self.config.state_dir, content, writes=self.writes).save()
            return content

    def _take_over(self, left: JournalContent) -> None:
        """The actuator is gone: resume what it left paused, without the lock, then record
        it if the journal is still nobody else's."""
        self.seen.journal_paused = len(left.paused)
        undone = left.lost is not None and self._undo_managed_pauses(left.lost)
        self._resumed &= {(e.container_id, e.paused_at) for e in left.paused.values()}
        done = []
        for entry in left.paused.values():
            if (entry.container_id, entry.paused_at) in self._resumed:
                done.append(entry)  # resumed at an earlier check that could not record it
                continue
            settled = self._resume(entry, "actuator gone")
            if settled is None:
                break  # the engine is down or hung: the next check tries again
            if settled:
                done.append(entry)
        recorded = False
        if (done or undone) and self._take_lock():
            try:
                recorded = self._record(done, left.lost if undone else None)
            finally:
                self.lock.release()
        if not recorded:  # the next check records them, without asking Docker again
            self._resumed |= {(e.container_id, e.paused_at) for e in done}

    def _record(self, resumed: list[PausedEntry], undone: str | None) -> bool:
        """Remove what was resumed from the journal (holding its lock); False when it could
        not be written."""
        try:
            journal = Journal(self.config.state_dir, writes=self.writes)
        except JournalCorrupt:
            return False  # changed meanwhile: the next check reads it again
        for entry in resumed:
            now = journal.paused.get(entry.container_id)
            if now is not None and now.paused_at == entry.paused_at:  # not paused anew since
                del journal.paused[entry.container_id]
        if undone is not None and journal.lost == undone:
            journal.lost = None
        return journal.save()

    def _watch(self, resume_all: bool) -> None:
        """The actuator holds the journal: read it, resume what is due, never write it."""
        try:
            content = load(self.journal_path)
        except JournalCorrupt as exc:
            if resume_all:  # stuck, and its record unreadable: the managed fallback
                self._undo_managed_pauses(f"actuator stuck, journal unreadable ({exc})")
                return
            if exc.salvaged is None:
                return
            content = exc.salvaged  # alive: its valid entries still get --max-pause
        paused = content.paused
        self.seen.journal_paused = len(paused)
        self._resumed &= {(e.container_id, e.paused_at) for e in paused.values()}
        self.clock.forget_except(list(paused.values()))
        limit = _max_pause(content.max_pause_s, self.config.max_pause_s)
        for entry in paused.values():
            key = (entry.container_id, entry.paused_at)
            overdue = self.clock.paused_for(entry) > limit
            if key in self._resumed or not (resume_all or overdue):
                continue
            why = "actuator stuck" if resume_all else "paused longer than --max-pause"
            settled = self._resume(entry, why)
            if settled is None:
                break
            if settled:
                self._resumed.add(key)

    def _resume(self, entry: PausedEntry, why: str) -> bool | None:
        """Unpause one journalled container; True when it is settled (resumed or gone),
        False when the engine refused (retried next check), None when it is unreachable."""
        cid = entry.container_id
        resume = functools.partial(resume_container, self.engine, self.freezer)
        tried = attempt(self.engine, resume, cid, look_again=False)
        if tried.answer is Answer.DOWN:
            self._engine_failing(tried.detail)
            return None
        if tried.answer is Answer.REFUSED:
            log.warning("guard: unpause %s failed, retrying: %s", entry.name, tried.detail)
            return False
        self._engine_failing(None)
        skip_reason = SkipReason.VANISHED if tried.answer is Answer.GONE else None
        if skip_reason is not None:
            result = Result.SKIPPED
        else:
            result = Result.OK if tried.value else Result.ALREADY
        if result == Result.OK:
            self.seen.resumed += 1
            log.warning("guard resumed %s (%s): %s", entry.name, cid[:12], why)
        self.audit.write(
            "guard_resume", container_id=cid, container=entry.name, result=result,
            skip_reason=skip_reason, why=why,
        )  # fmt: skip
        return True

    def _undo_managed_pauses(self, why: str) -> bool:
        """Resume every paused managed container; False when the engine could not be asked."""
        try:
            resumed = resume_managed_paused(self.engine, self.audit, why, self.freezer)
        except EngineDown as exc:
            self._engine_failing(str(exc))
            return False
        self._engine_failing(None)
        log.error("guard: %s: resumed %d paused managed container(s)", why, len(resumed))
        return True

    def _engine_failing(self, error: str | None) -> None:
        if error is not None and not self._engine_down:
            log.warning("%s engine unreachable, retrying: %s", self.engine.name, error)
        elif error is None and self._engine_down:
            log.info("%s engine answers again", self.engine.name)
        self._engine_down = self.seen.docker_down = error is not None


def _max_pause(recorded: float | None, own: float) -> float:
    """The stricter of the guard's --max-pause and the one the actuator recorded."""
    return own if recorded is None else min(own, recorded)


def run(config: GuardConfig) -> int:
    """Check every period until SIGTERM/SIGINT, then once more, and exit."""
    flags.start_logging(config.log_level, config.warnings, "gpuguard.guard")
    audit = AuditLog(config.state_dir / AUDIT_FILE)
    engine = open_engine(config.docker_host, config.containerd_address, config.containerd_namespace)
    guard = Guard(config, engine, audit)
    web = WebConfigWatcher(config.web) if config.web is not None else None
    server = guard_server(guard, config.listen_host, config.listen_port, web)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("guarding %s (--max-pause %gs)", config.state_dir, config.max_pause_s)
    while True:
        try:
            guard.check()
        except Exception:  # the guard must outlive anything: log and check again
            log.exception("guard check failed")
        if stop.wait(CHECK_PERIOD_S):
            break
    try:
        guard.check()  # an actuator stopped just before us may have left something paused
    except Exception:
        log.exception("final guard check failed")
    if server is not None:
        server.shutdown()
        server.server_close()
    audit.close()
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "guard",
        help="resume what the actuator paused if it dies or hangs; enforce --max-pause",
        description="Resume every container the actuator's journal says is paused when the "
        "actuator is gone or stuck, and enforce --max-pause. Run it beside the actuator on "
        "the same --state.dir, as a process (container, unit) of its own.",
    )
    flags.add_flags(parser, FLAGS)
    parser.set_defaults(func=_run_cli)


def _run_cli(args: argparse.Namespace) -> int:
    return flags.run_configured("gpuguard guard", lambda: validate(flags.merge(args, FLAGS)), run)
