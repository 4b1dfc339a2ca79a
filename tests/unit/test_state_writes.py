"""Writes to the state directory that fail (issue 26, item 2: "resume first, write later").

The pure parts, and the journal, leases and audit log with real failures made without
root: a non-empty directory where the journal goes (rename refuses it: EISDIR), a file
where the state directory should be (ENOTDIR). A full and a read-only disk are in
tests/integration/test_state_faults.py (tmpfs and a read-only bind mount).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from gpuguard import files
from gpuguard.actuator.audit import AUDIT_FILE, BACKLOG, AuditLog, read_audit
from gpuguard.actuator.decision import PAUSE, Decision, Step
from gpuguard.actuator.engine.base import ContainerState
from gpuguard.actuator.metrics import ActuatorMetrics
from gpuguard.actuator.safety import lease
from gpuguard.actuator.safety.failopen import JOURNAL_RETRY_S, FailOpen
from gpuguard.actuator.safety.journal import (
    JOURNAL_FILE,
    Journal,
    JournalUnwritable,
    PausedEntry,
    load,
)
from gpuguard.actuator.safety.statewrites import FILES, REASONS, StateWrites, reason_of
from gpuguard.contract import StepReason, TriggerSource
from tests.unit import policy_support as policy
from tests.unit.actuator_support import make_controller


def entry(cid: str, at: float | None = None) -> PausedEntry:
    return PausedEntry(cid, f"rt-{cid[:4]}", None, 0, time.time() if at is None else at, "newcomer")


def block(path: Path) -> None:
    """A non-empty directory where ``path`` goes: every atomic replace of it fails."""
    if path.is_file():
        path.unlink()
    path.mkdir()
    (path / "in-the-way").touch()


def unblock(path: Path) -> None:
    (path / "in-the-way").unlink()
    path.rmdir()


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (OSError(errno.ENOSPC, "full"), "no_space"),
        (OSError(errno.EDQUOT, "quota"), "no_space"),
        (OSError(errno.EROFS, "ro"), "read_only"),
        (OSError(errno.EACCES, "denied"), "read_only"),
        (OSError(errno.EISDIR, "dir"), "not_a_file"),
        (files.FileRefused("/x", "a symbolic link"), "not_a_file"),
        (OSError(errno.EIO, "io"), "other"),
        (OSError("no errno"), "other"),
    ],
)
def test_each_failure_has_its_reason(exc: OSError, reason: str) -> None:
    assert reason_of(exc) == reason


def test_a_failing_file_is_logged_once_per_change_and_counted_every_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    writes = StateWrites()
    full = OSError(errno.ENOSPC, "No space left on device")
    with caplog.at_level(logging.INFO, logger="gpuguard.state"):
        for _ in range(20):
            writes.failed("lease", Path("/s/guard.lease"), full)
        writes.failed("lease", Path("/s/guard.lease"), OSError(errno.EROFS, "Read-only"))
        writes.ok("lease")
        writes.ok("lease")
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("ERROR", "cannot write the lease (no_space): /s/guard.lease: No space left on "
         "device; retrying"),
        ("ERROR", "cannot write the lease (read_only): /s/guard.lease: Read-only; retrying"),
        ("INFO", "lease written again, after 21 failed write(s) over 0s"),
    ]  # fmt: skip
    counts = writes.counts()
    assert set(counts) == {(f, r) for f in FILES for r in REASONS}  # every pair, from 0
    assert counts[("lease", "no_space")] == 20 and counts[("lease", "read_only")] == 1
    assert writes.failing() == {}


def test_a_journal_that_cannot_be_written_keeps_what_it_holds_and_retries(
    tmp_path: Path,
) -> None:
    writes = StateWrites()
    journal = Journal(tmp_path, writes=writes)
    journal.will_pause(entry("a" * 64))
    block(tmp_path / JOURNAL_FILE)
    journal.released("a" * 64, admitted_at=5.0)  # no exception: what was done stays done
    assert journal.paused == {} and journal.admitted == {"a" * 64: 5.0}
    assert journal.unwritable == "Is a directory"
    assert writes.counts()[("journal", "not_a_file")] == 1
    assert journal.retry() == "Is a directory"  # tried again, still failing
    assert writes.counts()[("journal", "not_a_file")] == 2
    unblock(tmp_path / JOURNAL_FILE)
    assert journal.retry() is None
    written = load(tmp_path / JOURNAL_FILE)
    assert written.paused == {} and written.admitted == {"a" * 64: 5.0}
    assert journal.retry() is None and writes.counts()[("journal", "not_a_file")] == 2


def test_a_pause_the_journal_cannot_record_is_taken_back(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    kept = entry("a" * 64, at=1.0)
    journal.will_pause(kept)
    journal.admitted["b" * 64] = 2.0
    block(tmp_path / JOURNAL_FILE)
    with pytest.raises(JournalUnwritable, match="Is a directory"):
        journal.will_pause_many([entry("a" * 64, at=3.0), entry("b" * 64)])
    assert journal.paused["a" * 64].paused_at == 1.0  # as before: not the unrecorded one
    assert "b" * 64 not in journal.paused and journal.admitted == {"b" * 64: 2.0}


def test_a_directory_in_a_leases_place_is_moved_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / lease.GUARD_LEASE
    block(path)
    writes = StateWrites()
    with caplog.at_level(logging.ERROR):
        assert lease.renew(path, writes)
    assert 0 <= lease.age(path) < 5
    assert [p.name for p in tmp_path.glob(f"{lease.GUARD_LEASE}.bad-*")]
    assert "a directory: moved to" in caplog.text
    assert writes.failing() == {}


def test_a_lease_that_cannot_be_written_is_counted_not_raised(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file where the state directory should be")
    writes = StateWrites()
    assert not lease.renew(tmp_path / "state" / lease.ACTUATOR_LEASE, writes)
    assert writes.counts()[("lease", "not_a_file")] == 1
    assert writes.failing()["lease"].reason == "not_a_file"


def test_an_audit_log_that_cannot_be_written_keeps_its_lines_and_writes_them_later(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.write_text("a file where the state directory should be")
    writes = StateWrites()
    audit = AuditLog(state / AUDIT_FILE, writes)  # no exception
    for n in range(BACKLOG + 5):
        audit.write("guard_resume", n=n)
    assert writes.counts()[("audit", "not_a_file")] >= BACKLOG
    state.unlink()
    state.mkdir()
    audit.write("journal_writable")
    audit.close()
    records = read_audit(state / AUDIT_FILE)
    assert [r.get("n") for r in records[:3]] == [6, 7, 8]  # the oldest made room
    assert len(records) == BACKLOG and records[-1]["event"] == "journal_writable"
    assert "audit" not in writes.failing()


class Audit:
    def __init__(self) -> None:
        self.events: list[str] = []

    def write(self, event: str, **fields: Any) -> None:
        self.events.append(event)


def test_failing_open_while_the_journal_cannot_be_written() -> None:
    audit = Audit()
    fail_open = FailOpen("host-a", 300.0, 5.0, audit, ActuatorMetrics("host-a"))  # type: ignore[arg-type]
    assert fail_open.on_journal(None, True, 0.0) is None
    assert fail_open.on_journal("No space left on device", True, 1.0) == (
        "journal unwritable (No space left on device)"
    )
    assert fail_open.on_journal("No space left on device", True, 2.0) is None  # just resumed
    assert fail_open.on_journal("No space left on device", False, 1.0 + JOURNAL_RETRY_S) is None
    again = fail_open.on_journal("No space left on device", True, 1.5 + JOURNAL_RETRY_S)
    assert again is not None  # an unpause that failed is tried again
    assert fail_open.on_journal(None, True, 20.0) is None
    assert audit.events == ["journal_writable"]
    assert fail_open.on_journal("Read-only file system", False, 21.0) is None  # nothing held


class Engine:
    """A container engine's verbs over managed, running containers (paused or not)."""

    name = "docker"

    def __init__(self, *ids: str) -> None:
        self.paused = dict.fromkeys(ids, False)

    def ping(self) -> None:
        pass

    def inspect(self, cid: str) -> ContainerState:
        paused = self.paused[cid]
        labels = {"gpuguard.managed": "true"}
        return ContainerState(cid, cid[:4], labels, "paused" if paused else "running", True, paused)

    def containers(
        self, statuses: Collection[str] | None = None, label: str | None = None
    ) -> list[ContainerState]:
        listed = [self.inspect(cid) for cid in self.paused]
        return [c for c in listed if statuses is None or c.status in statuses]

    def pause(self, cid: str) -> None:
        self.paused[cid] = True

    def unpause(self, cid: str) -> None:
        self.paused[cid] = False


def test_an_actuator_that_cannot_write_its_journal_pauses_nothing_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policy, "NOW", time.time())
    a, b, held = policy.cid("a"), policy.cid("b"), "c" * 64
    controller = make_controller(tmp_path)
    engine = Engine(a, b, held)
    controller.executor.engine = engine
    controller.journal.will_pause(entry(held))
    engine.pause(held)
    block(controller.journal.path)
    assert not controller.journal.save()  # as at a start on a full disk
    controller.maintain()
    assert not engine.paused[held], "what it paused is resumed"
    assert controller.journal.paused == {}
    resumes = [r for r in read_audit(tmp_path / "state" / AUDIT_FILE) if r["event"] == "resume_all"]
    assert resumes[0]["why"] == "journal unwritable (Is a directory)"  # not the reconcile's
    metric = controller.metrics.registry.get_sample_value
    assert metric("gpuguard_actuator_journal_writable") == 0
    failures = {"file": "journal", "reason": "not_a_file"}
    assert (metric("gpuguard_actuator_state_write_failures_total", failures) or 0) >= 2
    assert "cannot write the journal (Is a directory): pausing nothing" in controller.health()
    # b's task waits behind a's kernel: the policy would pause it, and does not.
    st = policy.state(
        [policy.container("a"), policy.container("b")],
        [policy.task("a", "computing", 1), policy.task("b", "input", 2)],
        util=1.0,
        timestamp=time.time(),
    )
    report = controller.decide_now(TriggerSource.FAST, state=st)
    assert not any(engine.paused.values())
    assert [s["reason"] for s in report.skips] == ["journal_unwritable"]
    assert metric("gpuguard_actuator_skipped_total", {"reason": "journal_unwritable"}) == 1
    # The journal fails between the decision and the pause: the pause is not taken.
    unblock(controller.journal.path)
    controller.maintain()
    assert metric("gpuguard_actuator_journal_writable") == 1
    block(controller.journal.path)
    step = Step(PAUSE, b, "b", StepReason.NEWCOMER, 0, "t-b")
    report = controller._execute(Decision((step,)), TriggerSource.FAST)
    assert not engine.paused[b] and b not in controller.journal.paused
    assert [a["result"] for a in report.actions] == ["skipped"]
    unblock(controller.journal.path)
    controller.maintain()
    assert json.loads(controller.journal.path.read_text())["paused"] == {}
    assert "journal" not in controller.health()
    controller.audit.close()


def test_a_guard_check_resumes_before_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, the guard renewed its lease first, and a full disk failed every check there
    # (21 tracebacks in 12 s), before the resume. The order is watched, not changed.
    from gpuguard.actuator.guard.program import Guard, GuardConfig

    state = tmp_path / "state"
    state.mkdir()
    engine = Engine("c" * 64)
    engine.pause("c" * 64)
    Journal(state).will_pause(entry("c" * 64))
    order: list[str] = []
    unpause, renew = engine.unpause, lease.renew

    def unpausing(cid: str) -> None:
        order.append("resume")
        unpause(cid)

    def renewing(path: Path, writes: StateWrites | None = None) -> bool:
        order.append("renew")
        return renew(path, writes)

    monkeypatch.setattr(engine, "unpause", unpausing)
    monkeypatch.setattr(lease, "renew", renewing)
    audit = AuditLog(state / AUDIT_FILE)
    guard = Guard(GuardConfig(state, None, 120.0, 15.0, "info"), engine, audit)
    try:
        assert guard.check() == "gone"
    finally:
        audit.close()
    assert order == ["resume", "renew"]
    assert not engine.paused["c" * 64]
    assert os.path.exists(state / lease.GUARD_LEASE)
