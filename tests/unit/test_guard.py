"""The guard against hostile state, without Docker (the engine is an address where nothing
listens): it must neither crash, nor hang, nor hold the journal's lock while it waits."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.actuator import lease
from gpuguard.actuator.audit import AUDIT_FILE, AuditLog, read_audit
from gpuguard.actuator.executor import docker_api
from gpuguard.actuator.guard import Guard, GuardConfig
from gpuguard.actuator.journal import JOURNAL_FILE, JournalLock


@pytest.fixture
def guard(tmp_path: Path) -> Iterator[Guard]:
    config = GuardConfig(tmp_path, None, 120.0, lease_timeout_s=15.0, log_level="info")
    audit = AuditLog(tmp_path / AUDIT_FILE)
    yield Guard(config, docker_api(f"unix://{tmp_path}/no-docker.sock"), audit)
    audit.close()


def check_in_time(guard: Guard, seconds: float = 5.0) -> str:
    verdicts: list[str] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            verdicts.append(guard.check())
        except BaseException as exc:  # reported below
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the guard's check hung"
    assert not failed, failed
    return verdicts[0]


def make_hostile(path: Path, kind: str) -> None:
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "bad-entry":
        entry = {"container_id": "c1", "name": "n", "task_id": None, "gpu": 0,
                 "paused_at": "soon", "reason": "newcomer"}  # fmt: skip
        path.write_text(json.dumps({"version": 1, "paused": {"c1": entry}}))


@pytest.mark.parametrize("kind", ["directory", "fifo", "bad-entry"])
def test_a_hostile_journal_of_a_gone_actuator_is_set_aside(
    guard: Guard, tmp_path: Path, kind: str
) -> None:
    make_hostile(tmp_path / JOURNAL_FILE, kind)
    assert check_in_time(guard) == "gone"
    assert list(tmp_path.glob(f"{JOURNAL_FILE}.corrupt-*"))
    assert [r for r in read_audit(tmp_path / AUDIT_FILE) if r["event"] == "journal_unreadable"]
    assert check_in_time(guard) == "gone"  # and the next check is quiet
    assert JournalLock(tmp_path).try_acquire(), "the guard gave the lock back"


@pytest.mark.parametrize("kind", ["directory", "fifo", "bad-entry"])
def test_a_hostile_journal_of_a_live_actuator_is_left_to_it(
    guard: Guard, tmp_path: Path, kind: str
) -> None:
    make_hostile(tmp_path / JOURNAL_FILE, kind)
    actuator = JournalLock(tmp_path)
    assert actuator.try_acquire()
    try:
        lease.renew(tmp_path / lease.ACTUATOR_LEASE)
        assert check_in_time(guard) == "alive"
        assert not list(tmp_path.glob(f"{JOURNAL_FILE}.corrupt-*"))  # the actuator's to do
    finally:
        actuator.release()
