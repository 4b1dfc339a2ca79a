"""--max-pause on a clock no one can step (issue 20, item 3).

The journal's ``paused_at`` is wall time. With the clock stepped back (NTP, an operator, a
VM restored), a pause seemed to start in the future and the safety net never fired, in the
actuator and in the guard alike. Pauses are now judged on the host's boot clock, recorded in
the journal beside wall time, so the judgement also survives a restart of either.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuguard.actuator.audit import AUDIT_FILE, AuditLog, read_audit
from gpuguard.actuator.guard.program import Guard, GuardConfig
from gpuguard.actuator.safety import lease, pauseclock
from gpuguard.actuator.safety.journal import Journal, PausedEntry
from gpuguard.actuator.safety.journallock import JournalLock
from tests.unit.actuator_support import make_controller
from tests.unit.engine_fakes import FakeEngine

CID = "c" * 64


def stepped_back_entry(seconds_ago: float = 10.0) -> PausedEntry:
    """Paused ``seconds_ago`` on the boot clock; the wall clock has since gone back an hour,
    so its wall time looks an hour in the future."""
    return PausedEntry(
        CID, "rt-1", "t1", 0, time.time() + 3600, "newcomer",
        paused_boot=lease.boottime() - seconds_ago, boot_id=pauseclock.boot_id(),
    )  # fmt: skip


def max_pause_unpauses(tmp_path: Path) -> list[dict[str, Any]]:
    return [
        r
        for r in read_audit(tmp_path / "state" / AUDIT_FILE)
        if r["event"] == "action" and r.get("reason") == "max_pause"
    ]


def test_the_controller_judges_max_pause_on_the_boot_clock(tmp_path: Path) -> None:
    controller = make_controller(tmp_path, **{"max-pause": "2s"})
    controller.journal.will_pause(stepped_back_entry())
    controller.reconciler.enforce_max_pause()
    assert [r["container_id"] for r in max_pause_unpauses(tmp_path)] == [CID]
    controller.audit.close()


def test_a_new_pause_is_stamped_with_the_boot_clock_and_it_survives_a_restart(
    tmp_path: Path,
) -> None:
    controller = make_controller(tmp_path, **{"max-pause": "2s"})
    controller.journal.will_pause(PausedEntry(CID, "rt-1", "t1", 0, time.time(), "newcomer"))
    stamped = controller.journal.paused[CID]
    assert stamped.paused_boot == pytest.approx(lease.boottime(), abs=1)
    assert stamped.boot_id == pauseclock.boot_id()
    controller.audit.close()
    restarted = Journal(tmp_path / "state")
    assert restarted.paused[CID] == stamped
    assert restarted.clock.paused_for(stamped) < 2


def test_an_old_journal_without_a_boot_time_still_gets_max_pause(tmp_path: Path) -> None:
    # Written before boot times were recorded, with paused_at an hour ahead: judged from
    # when the journal was loaded (a lower bound of the real pause), never "not yet".
    booted = [1000.0]
    clock = pauseclock.PauseClock(boot=lambda: booted[0], boot_id="b")
    old = PausedEntry(CID, "rt-1", "t1", 0, time.time() + 3600, "newcomer")
    assert clock.paused_for(old) == 0.0
    booted[0] += 3
    assert clock.paused_for(old) == pytest.approx(3.0)
    aged = PausedEntry(CID, "rt-1", "t1", 0, time.time() - 50, "newcomer")
    assert clock.paused_for(aged) == pytest.approx(50, abs=1)  # the wall clock, as before
    other_boot = replace(stepped_back_entry(), boot_id="another boot")
    assert clock.paused_for(other_boot) == pytest.approx(0.0)  # its boot clock means nothing


def test_the_ledger_gives_the_policy_pause_starts_the_clock_step_cannot_move(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path)
    journal.will_pause(stepped_back_entry(seconds_ago=10))
    assert time.time() - journal.ledger().paused[CID] == pytest.approx(10, abs=1)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[JournalLock]:
    """A live actuator: it holds the journal and renews its lease."""
    lock = JournalLock(tmp_path)
    assert lock.try_acquire()
    lease.renew(tmp_path / lease.ACTUATOR_LEASE)
    yield lock
    lock.release()


def test_the_guard_judges_max_pause_on_the_boot_clock(tmp_path: Path, held: JournalLock) -> None:
    journal = Journal(tmp_path)
    journal.will_pause(stepped_back_entry())
    engine = FakeEngine()
    audit = AuditLog(tmp_path / AUDIT_FILE)
    config = GuardConfig(tmp_path, None, 2.0, lease_timeout_s=15.0, log_level="info")
    guard = Guard(config, engine, audit)
    assert guard.check() == "alive"
    assert engine.unpaused == [CID]
    audit.close()
