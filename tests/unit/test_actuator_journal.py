"""The journal: atomic, durable writes; reconcile planning; the watchdog's wait."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpuguard.actuator.journal import (
    JOURNAL_FILE,
    Journal,
    PausedEntry,
    atomic_write_json,
    plan_reconcile,
    read_journal,
)
from gpuguard.actuator.watchdog import proc_start_ticks, wait_for_exit


def entry(cid: str, paused_at: float = 100.0) -> PausedEntry:
    return PausedEntry(cid, f"name-{cid}", f"{cid}:1:1:1", 0, paused_at, "newcomer")


def test_pause_is_on_disk_before_it_is_taken(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.will_pause(entry("c1"))
    doc = read_journal(tmp_path / JOURNAL_FILE)
    assert doc["pid"] == os.getpid()
    assert doc["paused"]["c1"]["reason"] == "newcomer"
    assert Journal(tmp_path).paused == {"c1": entry("c1")}


def test_release_records_the_admission(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.will_pause(entry("c1"))
    journal.released("c1", admitted_on=0, at=123.0)
    again = Journal(tmp_path)
    assert again.paused == {}
    ledger = again.ledger()
    assert ledger.admitted == {"c1": 123.0} and ledger.last_admitted == {0: "c1"}


def test_exempt_and_prune(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.exempt("t1", 5.0)
    journal.exempt("t2", 6.0)
    journal.released("c9", admitted_on=0, at=1.0)
    journal.prune({"t2"}, set())
    again = Journal(tmp_path)
    assert set(again.exempt_tasks) == {"t2"} and again.admitted == {}


def test_atomic_write_never_leaves_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "j.json"
    atomic_write_json(path, {"version": 1, "a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"version": 1, "bad": object()})
    assert json.loads(path.read_text()) == {"version": 1, "a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j.json"]


def test_concurrent_writers_and_readers_see_whole_documents(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    stop = threading.Event()
    seen: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            seen.append(len(read_journal(tmp_path / JOURNAL_FILE).get("paused", {})))

    journal.save()
    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(50):
        journal.will_pause(entry(f"c{i}"))
    stop.set()
    thread.join()
    assert seen and max(seen) <= 50


def test_foreign_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_FILE).write_text('{"version": 99}')
    with pytest.raises(ValueError, match="not a gpuguard actuator journal"):
        Journal(tmp_path)


@pytest.mark.parametrize(
    ("docker", "with_tasks", "paused_at", "verdict"),
    [
        (None, {"c1"}, 100.0, "forget"),  # container gone
        (False, {"c1"}, 100.0, "forget"),  # someone unpaused it
        (True, {"c1"}, 0.0, "unpause"),  # paused longer than --max-pause
        (True, None, 100.0, "unpause"),  # exporter unavailable: never hold blind
        (True, set(), 100.0, "unpause"),  # its task is gone
        (True, {"c1"}, 100.0, "keep"),  # still waiting for the GPU
    ],
)
def test_plan_reconcile(
    docker: bool | None, with_tasks: set[str] | None, paused_at: float, verdict: str
) -> None:
    steps = plan_reconcile({"c1": entry("c1", paused_at)}, {"c1": docker}, with_tasks, 110.0, 60.0)
    assert [(s.container_id, s.verdict) for s in steps] == [("c1", verdict)]


def test_reconcile_leaves_containers_paused_by_someone_else() -> None:
    assert plan_reconcile({}, {"other": True}, set(), 110.0, 60.0) == []


def test_wait_for_exit_returns_when_the_process_dies() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    ticks = proc_start_ticks(proc.pid)
    assert ticks is not None
    done = threading.Event()

    def watch() -> None:
        wait_for_exit(proc.pid, ticks)
        done.set()

    thread = threading.Thread(target=watch)
    thread.start()
    time.sleep(0.2)
    assert not done.is_set()
    proc.kill()
    proc.wait()
    thread.join(timeout=5)
    assert done.is_set()


def test_wait_for_exit_with_a_recycled_pid_returns_at_once() -> None:
    ticks = proc_start_ticks(os.getpid())
    assert ticks is not None
    started = time.monotonic()
    wait_for_exit(os.getpid(), ticks + 1)  # same PID, other start time: not our actuator
    assert time.monotonic() - started < 1
