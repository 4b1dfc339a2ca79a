"""The journal: atomic, durable writes; one owner (flock); unreadable files set aside;
reconcile planning; leases."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from gpuguard.actuator.app import open_journal
from gpuguard.actuator.safety import lease
from gpuguard.actuator.safety.journal import (
    JOURNAL_FILE,
    Journal,
    JournalCorrupt,
    PausedEntry,
    atomic_write_json,
    plan_reconcile,
    read_journal,
)
from gpuguard.actuator.safety.journallock import JournalLock
from tests.waiting import wait_for


def entry(cid: str, paused_at: float = 100.0) -> PausedEntry:
    return PausedEntry(cid, f"name-{cid}", f"{cid}:1:1:1", 0, paused_at, "newcomer")


def test_pause_is_on_disk_before_it_is_taken(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.will_pause(entry("c1"))
    doc = read_journal(tmp_path / JOURNAL_FILE)
    assert doc["pid"] == os.getpid()
    assert doc["paused"]["c1"]["reason"] == "newcomer"
    again = Journal(tmp_path).paused["c1"]
    assert replace(again, paused_boot=None, boot_id=None) == entry("c1")
    assert again == journal.paused["c1"]  # with its boot clock reading (pauseclock)


def test_a_pause_intent_is_visible_before_it_is_durable(tmp_path: Path) -> None:
    # Before a freeze: replaced over the journal, so the guard (another process) reads it;
    # fsynced by sync() right after the freeze, off the path from a task to its freeze.
    journal = Journal(tmp_path)
    journal.will_pause_many([entry("c1"), entry("c2")], durable=False)
    assert set(read_journal(tmp_path / JOURNAL_FILE)["paused"]) == {"c1", "c2"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [JOURNAL_FILE]  # no temp file left
    journal.sync()
    assert set(Journal(tmp_path).paused) == {"c1", "c2"}


def test_release_records_the_admission(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.will_pause(entry("c1"))
    journal.released("c1", admitted_at=123.0)
    again = Journal(tmp_path)
    assert again.paused == {}
    ledger = again.ledger()
    assert ledger.admitted == {"c1": 123.0}


def test_exempt_and_prune(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.exempt("t1", 5.0)
    journal.exempt("t2", 6.0)
    journal.released("c9", admitted_at=1.0)
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
    steps = plan_reconcile(
        {"c1": entry("c1", paused_at)}, {"c1": docker}, with_tasks, lambda e: 110 - e.paused_at, 60
    )
    assert [(s.container_id, s.verdict) for s in steps] == [("c1", verdict)]


def test_reconcile_leaves_containers_paused_by_someone_else() -> None:
    assert plan_reconcile({}, {"other": True}, set(), lambda e: 0.0, 60.0) == []


GOOD = {"version": 1, "paused": {"c1": {"container_id": "c1", "name": "n", "task_id": None,
        "gpu": 0, "paused_at": 1.0, "reason": "newcomer"}}}  # fmt: skip


@pytest.mark.parametrize(
    "content",
    [
        b"",  # empty (a full disk, an editor, a copy gone wrong)
        json.dumps(GOOD).encode()[:40],  # truncated
        b"\x00\xff garbage \x89PNG",  # garbage, not even UTF-8
        b"[1, 2, 3]",  # JSON, not a journal
        json.dumps({"version": 1, "paused": {"c1": {"container_id": "c1"}}}).encode(),
        json.dumps({"version": 1, "paused": [1]}).encode(),
        json.dumps({"version": 1, "admitted": {"c1": "soon"}}).encode(),
    ],
    ids=["empty", "truncated", "garbage", "not-a-journal", "entry", "paused-list", "admitted"],
)
def test_unreadable_journal_is_set_aside_not_a_crash(tmp_path: Path, content: bytes) -> None:
    (tmp_path / JOURNAL_FILE).write_bytes(content)
    with pytest.raises(JournalCorrupt):
        Journal(tmp_path)
    journal, lost = open_journal(tmp_path)
    assert journal.paused == {} and lost is not None
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(f"{JOURNAL_FILE}.corrupt-")]
    assert len(kept) == 1 and kept[0].read_bytes() == content  # kept for the operator
    assert kept[0].name in lost
    # The new journal records the loss, so the undoing survives a restart until done.
    assert json.loads((tmp_path / JOURNAL_FILE).read_text())["lost"] == lost


def test_a_readable_journal_opens_as_is(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_FILE).write_text(json.dumps(GOOD))
    journal, lost = open_journal(tmp_path)
    assert lost is None and list(journal.paused) == ["c1"]


def test_the_journal_lock_has_one_holder(tmp_path: Path) -> None:
    first, second = JournalLock(tmp_path), JournalLock(tmp_path)
    assert first.try_acquire()
    assert first.held and first.holder() == str(os.getpid())
    assert not second.try_acquire() and not second.held
    first.release()
    assert second.try_acquire()
    second.release()


HOLD = """
import sys, time
from pathlib import Path
from gpuguard.actuator.safety.journallock import JournalLock
lock = JournalLock(Path(sys.argv[1]))
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_killed_holder_drops_the_lock(tmp_path: Path) -> None:
    # What the guard relies on: kill -9 of the actuator frees the journal at once.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        waiter = JournalLock(tmp_path)
        assert not waiter.try_acquire()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        wait_for(waiter.try_acquire, 5, "the lock to be free", interval=0.01)
        waiter.release()
    finally:
        holder.kill()
        holder.wait()


def test_lease_renewal_and_age(tmp_path: Path) -> None:
    path = tmp_path / lease.ACTUATOR_LEASE
    assert lease.read(path) is None
    assert lease.age(path) == math.inf  # never renewed: what GpuguardGuardMissing sees
    lease.renew(path)
    assert 0 <= lease.age(path) < 5
    seen = lease.read(path)
    assert seen is not None and seen.pid == os.getpid()
    assert 0 <= seen.age() < 5
    assert seen.age(now=seen.renewed + 20) == pytest.approx(20)
    path.write_text("{not json")
    assert lease.read(path) is None and lease.age(path) == math.inf


# Issue 20, item 6: nothing in the state directory is reached through a symbolic link.


def outside_file(tmp_path: Path) -> Path:
    target = tmp_path / "outside.txt"
    target.write_text("an operator's file\n")
    target.chmod(0o644)
    return target


def test_a_journal_lock_link_is_moved_aside_never_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    target = outside_file(tmp_path)
    (state / "journal.lock").symlink_to(target)
    lock = JournalLock(state)
    assert lock.try_acquire()
    lock.release()
    assert target.read_text() == "an operator's file\n"  # not truncated, not overwritten
    assert not (state / "journal.lock").is_symlink() and (state / "journal.lock").is_file()
    assert [p for p in state.iterdir() if p.name.startswith("journal.lock.")]  # kept aside


def test_an_audit_log_link_is_moved_aside_never_appended_to(tmp_path: Path) -> None:
    from gpuguard.actuator.audit import AuditLog

    state = tmp_path / "state"
    state.mkdir()
    target = outside_file(tmp_path)
    (state / "audit.jsonl").symlink_to(target)
    audit = AuditLog(state / "audit.jsonl")
    audit.write("start")
    audit.close()
    assert target.read_text() == "an operator's file\n"
    assert target.stat().st_mode & 0o777 == 0o644  # never chmod'ed through the link
    assert not (state / "audit.jsonl").is_symlink()
    assert (state / "audit.jsonl").stat().st_mode & 0o777 == 0o600


def test_leases_are_never_read_through_a_link_nor_hang_on_a_fifo(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text(json.dumps({"pid": 1, "renewed": lease.boottime()}))
    (tmp_path / lease.ACTUATOR_LEASE).symlink_to(target)
    assert lease.read(tmp_path / lease.ACTUATOR_LEASE) is None
    os.mkfifo(tmp_path / lease.GUARD_LEASE)
    reader = threading.Thread(target=lease.read, args=(tmp_path / lease.GUARD_LEASE,))
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "reading a FIFO lease hung"
    lease.renew(tmp_path / lease.GUARD_LEASE)  # replaces the FIFO with a lease
    assert lease.age(tmp_path / lease.GUARD_LEASE) < 5
    assert target.read_text().startswith("{")


# Issue 20, item 7: a hostile journal is moved aside, never a crash or a hang.


def open_in_time(state: Path, seconds: float = 5.0) -> tuple[Journal, str | None]:
    result: list[tuple[Journal, str | None]] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            result.append(open_journal(state))
        except BaseException as exc:  # reported below
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "opening the journal hung"
    assert not failed, failed
    return result[0]


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink", "socket"])
def test_a_journal_that_is_not_a_regular_file_is_set_aside(tmp_path: Path, kind: str) -> None:
    import socket

    path = tmp_path / JOURNAL_FILE
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "real.json").write_text(json.dumps(GOOD))
        path.symlink_to(tmp_path / "real.json")
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    journal, lost = open_in_time(tmp_path)
    assert lost is not None and journal.paused == {}
    assert [p for p in tmp_path.iterdir() if p.name.startswith(f"{JOURNAL_FILE}.corrupt-")]
    assert json.loads((tmp_path / JOURNAL_FILE).read_text())["version"] == 1
    if kind == "symlink":
        assert json.loads((tmp_path / "real.json").read_text()) == GOOD  # untouched


def bad_paused(**fields: object) -> dict[str, object]:
    good = dict(GOOD["paused"]["c1"])  # type: ignore[index]
    good.update(fields)
    return good


@pytest.mark.parametrize(
    "entry",
    [
        bad_paused(paused_at="soon"),
        bad_paused(paused_at=float("nan")),
        bad_paused(paused_at=float("inf")),
        bad_paused(paused_at=True),
        bad_paused(gpu="0"),
        bad_paused(name=["x"]),
        bad_paused(container_id="other"),
        bad_paused(task_id=7),
        bad_paused(paused_boot="later"),
    ],
    ids=["text", "nan", "inf", "bool", "gpu-text", "name-list", "id-mismatch", "task-int",
         "boot-text"],
)  # fmt: skip
def test_a_bad_paused_entry_is_moved_aside_and_the_rest_kept(
    tmp_path: Path, entry: dict[str, object]
) -> None:
    good = dict(GOOD["paused"]["c1"])  # type: ignore[index]
    good["container_id"] = "c2"
    doc = {"version": 1, "paused": {"c1": entry, "c2": good}, "admitted": {"c3": 5.0}}
    (tmp_path / JOURNAL_FILE).write_text(json.dumps(doc))
    journal, lost = open_in_time(tmp_path)
    assert lost is not None and "paused" in lost  # every managed pause gets resumed
    assert list(journal.paused) == ["c2"] and journal.admitted == {"c3": 5.0}
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(f"{JOURNAL_FILE}.corrupt-")]
    assert len(kept) == 1 and kept[0].read_text() == json.dumps(doc)  # for the operator
    assert "c1" not in json.loads((tmp_path / JOURNAL_FILE).read_text())["paused"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("admitted", {"c1": "soon"}),
        ("exempt_tasks", {"t": None}),
        ("max_pause_s", "long"),
        ("nodes", {"node": "host-a", "since": 1.0, "reasons": [{"alertname": "x"}]}),
        ("nodes", {"node": "host-a", "since": "yesterday", "reasons": []}),
        ("nodes", {"node": "host-a", "resolved_alerts": {"f1": ["2025-11-22T01:00:00", 1.0]}}),
        ("alerts", {"resolved": {"f1": ["2025-11-22T01:00:00", 1.0]}}),
        ("alerts", {"resolved": {"f1": ["2025-11-22T01:00:00+00:00", "x"]}}),
        ("alerts", {"fail_open": {"f1": "now"}}),
        ("alerts", []),
    ],
)
def test_every_field_is_checked_at_load(tmp_path: Path, field: str, value: object) -> None:
    doc = {**GOOD, field: value}
    (tmp_path / JOURNAL_FILE).write_text(json.dumps(doc))
    journal, lost = open_in_time(tmp_path)
    assert lost is not None and field in lost
    assert list(journal.paused) == ["c1"]


def test_a_valid_journal_has_no_problems(tmp_path: Path) -> None:
    doc = {
        **GOOD,
        "admitted": {"c9": 1.0},
        "exempt_tasks": {"t": 2.0},
        "max_pause_s": 120.0,
        "nodes": {"node": "host-a", "since": 1.0, "provisionable": True, "reasons": []},
        "alerts": {"resolved": {"f1": ["2025-11-22T01:00:00+00:00", 1.0]}, "fail_open": {}},
    }
    (tmp_path / JOURNAL_FILE).write_text(json.dumps(doc))
    journal, lost = open_in_time(tmp_path)
    assert lost is None and list(journal.paused) == ["c1"]
