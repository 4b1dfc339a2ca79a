"""The actuator's state directory is a contract between releases: an actuator and a guard of
different releases meet only there (a staggered restart of their units runs one of each).
Every file name and the lease's wire format are pinned here, and checked against the table
that documents them (docs/interfaces.md, section 10)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.actuator.audit import AUDIT_FILE, AuditLog
from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.guard.program import Guard, GuardConfig
from gpuguard.actuator.safety import lease
from gpuguard.actuator.safety.journal import JOURNAL_FILE
from gpuguard.actuator.safety.journallock import LOCK_FILE, JournalLock

REPO = Path(__file__).resolve().parents[2]

#: every name a release has written in the state directory, and what it must stay
PINNED = {
    "journal": (JOURNAL_FILE, "journal.json"),
    "lock": (LOCK_FILE, "journal.lock"),
    "audit": (AUDIT_FILE, "audit.jsonl"),
    "actuator lease": (lease.ACTUATOR_LEASE, "actuator.lease"),
    "guard lease": (lease.GUARD_LEASE, "guard.lease"),
}
#: names an earlier release wrote for the actuator's lease, still renewed and read
FORMER_ACTUATOR_LEASES = ("actuator.safety.lease",)


@pytest.mark.parametrize("what", sorted(PINNED))
def test_state_file_names_are_pinned(what: str) -> None:
    name, pinned = PINNED[what]
    assert name == pinned


def test_every_former_lease_name_is_still_renewed_and_read() -> None:
    assert set(FORMER_ACTUATOR_LEASES) <= set(lease.ACTUATOR_LEASE_ALIASES)


def documented_names() -> set[str]:
    text = (REPO / "docs" / "interfaces.md").read_text()
    section = text.split("## 10. The actuator's state directory", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {m for row in rows for m in re.findall(r"`([a-z.]+)`", row.split("|")[1])}


def test_the_documented_table_names_exactly_the_files_in_the_code() -> None:
    code = {name for name, _ in PINNED.values()} | set(lease.ACTUATOR_LEASE_ALIASES)
    assert documented_names() == code


def test_a_lease_is_pid_and_boot_time_renewed(tmp_path: Path) -> None:
    assert lease.renew(tmp_path / "x.lease")
    doc = json.loads((tmp_path / "x.lease").read_text())
    assert set(doc) == {"pid", "renewed"}
    assert abs(doc["renewed"] - lease.boottime()) < 5
    # written by hand in that format (as another release writes it): read back
    (tmp_path / "y.lease").write_text(json.dumps({"pid": 7, "renewed": lease.boottime() - 3}))
    held = lease.read(tmp_path / "y.lease")
    assert held is not None and held.pid == 7 and 2 < held.age() < 10


def test_the_actuator_renews_its_lease_under_every_name(tmp_path: Path) -> None:
    assert lease.renew_actuator(tmp_path)
    for name in (lease.ACTUATOR_LEASE, *lease.ACTUATOR_LEASE_ALIASES):
        held = lease.read(tmp_path / name)
        assert held is not None and held.age() < 5, name


@pytest.mark.parametrize("name", [lease.ACTUATOR_LEASE, *FORMER_ACTUATOR_LEASES])
def test_the_freshest_lease_under_any_name_counts(tmp_path: Path, name: str) -> None:
    others = {lease.ACTUATOR_LEASE, *lease.ACTUATOR_LEASE_ALIASES} - {name}
    for other in others:  # stale, as left by an actuator of another release
        (tmp_path / other).write_text(json.dumps({"pid": 1, "renewed": lease.boottime() - 600}))
    (tmp_path / name).write_text(json.dumps({"pid": 2, "renewed": lease.boottime()}))
    held = lease.read_actuator(tmp_path)
    assert held is not None and held.pid == 2


@pytest.fixture
def guard(tmp_path: Path) -> Iterator[Guard]:
    config = GuardConfig(tmp_path, None, 120.0, lease_timeout_s=15.0, log_level="info")
    audit = AuditLog(tmp_path / AUDIT_FILE)
    yield Guard(config, DockerEngine(f"unix://{tmp_path}/no-docker.sock"), audit)
    audit.close()


@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[JournalLock]:
    """The journal's lock held, as a live actuator holds it (another open file: flock)."""
    lock = JournalLock(tmp_path)
    assert lock.try_acquire()
    yield lock
    lock.release()


@pytest.mark.parametrize("name", [lease.ACTUATOR_LEASE, *FORMER_ACTUATOR_LEASES])
def test_the_guard_sees_an_actuator_of_any_release_alive(
    guard: Guard, held_lock: JournalLock, tmp_path: Path, name: str
) -> None:
    (tmp_path / name).write_text(json.dumps({"pid": 2, "renewed": lease.boottime()}))
    assert guard.check() == "alive"
    assert guard.seen.actuator_lease_age_s < 5


def test_the_guard_finds_a_lockholder_without_a_lease_stuck(
    guard: Guard, held_lock: JournalLock
) -> None:
    started = time.monotonic()
    assert guard.check() == "stuck"
    assert time.monotonic() - started < 10
