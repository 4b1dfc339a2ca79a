"""The guard's log: a normal start or stop (no actuator yet, or no longer, and nothing it
paused) is not a WARNING; taking over what a gone actuator left paused is."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuguard.actuator.audit import AUDIT_FILE, AuditLog
from gpuguard.actuator.guard.program import Guard, GuardConfig
from gpuguard.actuator.safety.journal import FORMAT_VERSION, JOURNAL_FILE, atomic_write_json
from tests.unit.engine_fakes import FakeEngine


def _guard(state_dir: Path) -> Guard:
    state_dir.mkdir(mode=0o700)
    config = GuardConfig(state_dir, None, 120.0, 15.0, "info")
    # the one container the journal names is not paused (nor running)
    engine = FakeEngine(paused=False, running=False)
    return Guard(config, engine, AuditLog(state_dir / AUDIT_FILE))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_no_actuator_and_nothing_paused_is_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    guard = _guard(tmp_path / "state")
    with caplog.at_level(logging.INFO, logger="gpuguard.guard"):
        assert guard.check() == "gone"
    assert _warnings(caplog) == []
    assert "names nothing paused" in caplog.text


def test_taking_over_paused_containers_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    guard = _guard(tmp_path / "state")
    entry = {"container_id": "c" * 64, "name": "rt-1", "task_id": None, "gpu": 0,
             "paused_at": 1.0, "reason": "newcomer"}  # fmt: skip
    doc = {"version": FORMAT_VERSION, "paused": {entry["container_id"]: entry}}
    atomic_write_json(tmp_path / "state" / JOURNAL_FILE, doc)
    with caplog.at_level(logging.INFO, logger="gpuguard.guard"):
        assert guard.check() == "gone"
    assert _warnings(caplog) == ["no actuator holds the journal: resuming what it left paused"]
