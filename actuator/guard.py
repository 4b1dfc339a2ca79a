"""``gpuguard guard``: resume what the actuator paused when the actuator cannot.

Its own program (own systemd unit, own container, sharing the actuator's state directory),
so nothing that ends the actuator ends it: not PID 1 of the actuator's container dying,
not systemd's ``KillMode=mixed``. Every half second it looks at the actuator:

* **gone** (it can take the journal's ``flock``; the kernel dropped the actuator's when it
  died, ``kill -9`` included): it resumes every container the journal says is paused,
  removes them from the journal it now owns, and gives the lock back at once, so a new
  actuator is never kept waiting for long;
* **stuck** (someone holds the lock but the actuator's lease in the state directory was not
  renewed within ``--lease.timeout``): it resumes them too, without writing the journal,
  which is not its own while the actuator lives;
* **alive**: it enforces ``--max-pause`` from the journal (the stricter of its own and the
  one the actuator recorded there), whatever the actuator does.

A journal it cannot read is moved aside when the actuator is gone (kept for the operator)
and every paused container labelled ``gpuguard.managed=true`` is resumed: it no longer says
which pauses were the actuator's, and a tenant left frozen is what must never happen. The
guard never pauses anything, and never touches a container the journal does not name
(except, with an unreadable journal, managed ones).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors

from gpuguard import flags
from gpuguard.actuator import lease
from gpuguard.actuator.audit import AUDIT_FILE, AuditLog
from gpuguard.actuator.config import engine_url, host_path, private_state_dir
from gpuguard.actuator.errors import ConfigError, DockerUnavailable
from gpuguard.actuator.executor import (
    docker_api,
    docker_call,
    resume_container,
    resume_managed_paused,
)
from gpuguard.actuator.freezer import ContainerFreezer
from gpuguard.actuator.journal import (
    JOURNAL_FILE,
    JournalCorrupt,
    JournalLock,
    PausedEntry,
    atomic_write_json,
    paused_entries,
    read_journal,
    set_aside,
)
from gpuguard.flags import Flag

log = logging.getLogger("gpuguard.guard")

CHECK_PERIOD_S = 0.5

FLAGS: tuple[Flag, ...] = (
    Flag("state.dir", "/var/lib/gpuguard/actuator", "the actuator's --state.dir (shared)"),
    Flag("docker.host", None, "Docker engine URL (default: DOCKER_HOST or the local socket)"),
    Flag("max-pause", "120s", "resume any container the journal says is paused this long",
         "duration"),
    Flag("lease.timeout", "15s", "the actuator's lease older than this: it counts as stuck",
         "duration"),
    Flag("log.level", "info", "debug, info, warning or error"),
    Flag("path.procfs", "/proc", "the host's procfs (the actuator's --path.procfs)"),
    Flag("path.sysfs", "/sys", "the host's sysfs (the actuator's --path.sysfs)"),
)  # fmt: skip


@dataclass(frozen=True)
class GuardConfig:
    state_dir: Path
    docker_host: str | None
    max_pause_s: float
    lease_timeout_s: float
    log_level: str
    warnings: tuple[str, ...] = ()
    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")


@flags.reraise_as(ConfigError)
def validate(values: Mapping[str, Any]) -> GuardConfig:
    """Check every flag once; raises ``ConfigError`` with one clear line."""
    warnings: list[str] = []
    docker_host = engine_url(values, "docker.host")
    max_pause_s = flags.duration(values, "max-pause")
    lease_timeout_s = flags.duration(values, "lease.timeout")
    log_level = flags.choice(values, "log.level", ("debug", "info", "warning", "error"))
    procfs, sysfs = host_path(values, "path.procfs"), host_path(values, "path.sysfs")
    # Last: a bad flag must leave no directory behind.
    state_dir = private_state_dir(Path(str(values["state.dir"])), warnings)
    return GuardConfig(
        state_dir,
        docker_host,
        max_pause_s,
        lease_timeout_s,
        log_level,
        tuple(warnings),
        procfs,
        sysfs,
    )


class Guard:
    """One ``check()`` per period; every Docker or journal failure is retried next time."""

    def __init__(self, config: GuardConfig, api: Any, audit: AuditLog) -> None:
        self.config = config
        self.api = api
        self.audit = audit
        # A pause is a cgroup freeze before Docker hears of it: a crash in between leaves
        # one only the cgroup shows, and the guard thaws that too.
        self.freezer = ContainerFreezer(config.procfs, config.sysfs)
        self.lock = JournalLock(config.state_dir)
        self.journal_path = config.state_dir / JOURNAL_FILE
        self.verdict = ""
        # (container id, paused_at) resumed while the journal was not ours to write: done
        # once, not on every check, for as long as the journal keeps naming it.
        self._resumed: set[tuple[str, float]] = set()
        self._docker_down = False

    def check(self) -> str:
        """Look at the actuator and do what its state calls for; returns the verdict."""
        lease.renew(self.config.state_dir / lease.GUARD_LEASE)
        left_paused: int | None = 0
        if self.lock.try_acquire():
            try:
                verdict = "gone"
                left_paused = self._take_over()
            finally:
                self.lock.release()
        else:
            held = lease.read(self.config.state_dir / lease.ACTUATOR_LEASE)
            stuck = held is None or held.age() > self.config.lease_timeout_s
            verdict = "stuck" if stuck else "alive"
            self._watch(resume_all=stuck)
        if verdict != self.verdict:
            self._announce(verdict, left_paused)
            self.verdict = verdict
        return verdict

    def _announce(self, verdict: str, left_paused: int | None) -> None:
        if verdict == "alive":
            log.info("actuator alive: enforcing --max-pause %gs", self.config.max_pause_s)
        elif verdict == "gone" and left_paused == 0:
            # every start (the guard first) and every stop: nothing is wrong
            log.info("no actuator holds the journal, and it names nothing paused")
        elif verdict == "gone":
            log.warning("no actuator holds the journal: resuming what it left paused")
        else:
            log.warning(
                "actuator holds the journal but its lease is over %gs old: resuming everything "
                "it paused", self.config.lease_timeout_s,
            )  # fmt: skip
        self.audit.write("guard", verdict=verdict)

    def _take_over(self) -> int | None:
        """The actuator is gone and the journal is ours: resume, then record it. Returns how
        many containers the journal named paused (None: it could not be read)."""
        try:
            doc = read_journal(self.journal_path)
            paused = paused_entries(doc)
        except JournalCorrupt as exc:
            kept = set_aside(self.journal_path)
            log.error("JOURNAL UNREADABLE: %s; moved to %s", exc, kept)
            self.audit.write("journal_unreadable", detail=f"{exc}; kept as {kept.name}")
            self._undo_managed_pauses(f"journal unreadable ({exc})")
            return None
        if not paused:
            return 0
        done = [e.container_id for e in paused.values() if self._resume(e, "actuator gone")]
        if done:
            for cid in done:
                doc["paused"].pop(cid, None)
            atomic_write_json(self.journal_path, doc)
        return len(paused)

    def _watch(self, resume_all: bool) -> None:
        """The actuator holds the journal: read it, resume what is due, never write it."""
        try:
            doc = read_journal(self.journal_path)
            paused = paused_entries(doc)
        except JournalCorrupt as exc:
            if resume_all:  # stuck, and its record unreadable: the managed fallback
                self._undo_managed_pauses(f"actuator stuck, journal unreadable ({exc})")
            return
        self._resumed &= {(e.container_id, e.paused_at) for e in paused.values()}
        limit = _max_pause(doc, self.config.max_pause_s)
        now = time.time()  # the journal's paused_at is wall time
        for entry in paused.values():
            key = (entry.container_id, entry.paused_at)
            overdue = now - entry.paused_at > limit
            if key in self._resumed or not (resume_all or overdue):
                continue
            why = "actuator stuck" if resume_all else "paused longer than --max-pause"
            if self._resume(entry, why):
                self._resumed.add(key)

    def _resume(self, entry: PausedEntry, why: str) -> bool:
        """Unpause one journalled container; True when it is settled (resumed or gone)."""
        cid = entry.container_id
        try:
            unpaused = docker_call(lambda: resume_container(self.api, self.freezer, cid))
        except docker.errors.NotFound:
            result = "vanished"
        except DockerUnavailable as exc:
            self._docker_failing(str(exc))
            return False
        except docker.errors.APIError as exc:
            log.warning("guard: unpause %s failed, retrying: %s", entry.name, exc)
            return False
        else:
            result = "ok" if unpaused else "already"
        self._docker_failing(None)
        if result == "ok":
            log.warning("guard resumed %s (%s): %s", entry.name, cid[:12], why)
        self.audit.write(
            "guard_resume", container_id=cid, container=entry.name, result=result, why=why
        )
        return True

    def _undo_managed_pauses(self, why: str) -> None:
        try:
            resumed = resume_managed_paused(self.api, self.audit, why, self.freezer)
        except DockerUnavailable as exc:
            self._docker_failing(str(exc))
            return
        self._docker_failing(None)
        log.error("guard: %s: resumed %d paused managed container(s)", why, len(resumed))

    def _docker_failing(self, error: str | None) -> None:
        if error is not None and not self._docker_down:
            log.warning("docker engine unreachable, retrying: %s", error)
        elif error is None and self._docker_down:
            log.info("docker engine answers again")
        self._docker_down = error is not None


def _max_pause(doc: Mapping[str, Any], own: float) -> float:
    """The stricter of the guard's --max-pause and the one the actuator recorded."""
    recorded = doc.get("max_pause_s")
    if isinstance(recorded, int | float) and not isinstance(recorded, bool) and recorded > 0:
        return min(own, float(recorded))
    return own


def run(config: GuardConfig) -> int:
    """Check every period until SIGTERM/SIGINT, then once more, and exit."""
    flags.start_logging(config.log_level, config.warnings, "gpuguard.guard")
    audit = AuditLog(config.state_dir / AUDIT_FILE)
    guard = Guard(config, docker_api(config.docker_host), audit)
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
