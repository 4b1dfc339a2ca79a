"""The safety net against a real private dockerd: the guard, an unreadable journal, and an
actuator that starts while Docker is down.

Tenant containers are busybox ``sleep`` containers paused through the Docker API, as the
actuator would have paused them; the journal says which of them "the actuator" paused.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests

from gpuguard.actuator.audit import AUDIT_FILE, AuditLog, read_audit
from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.guard.program import Guard, GuardConfig
from gpuguard.actuator.safety import lease
from gpuguard.actuator.safety.journal import JOURNAL_FILE, atomic_write_json
from gpuguard.actuator.safety.journallock import JournalLock
from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.process import ManagedProcess, free_port
from tests.support.actuatorcli import actuator_argv
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

MANAGED = {"gpuguard.managed": "true"}


@pytest.fixture
def tenants(docker_client: Any, base_image: str) -> Iterator[Callable[..., Any]]:
    """Start a ``sleep`` container with labels, paused if asked; all removed afterwards."""
    made: list[Any] = []

    def start(name: str, labels: dict[str, str], paused: bool = True) -> Any:
        container = docker_client.containers.run(
            base_image, ["sleep", "300"], labels=labels, detach=True, network_mode="none",
            name=f"{name}-{os.getpid()}",
        )  # fmt: skip
        made.append(container)
        if paused:
            container.pause()
        return container

    yield start
    for container in made:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:  # a test removed it itself
            pass


def is_paused(client: Any, container: Any) -> bool:
    return bool(client.api.inspect_container(container.id)["State"]["Paused"])


def journal_doc(*containers: Any, paused_at: float | None = None) -> dict[str, Any]:
    at = time.time() if paused_at is None else paused_at
    return {
        "version": 1,
        "pid": 1,
        "paused": {c.id: paused_entry(c.id, c.name, at) for c in containers},
        "admitted": {},
        "last_admitted": {},
        "exempt_tasks": {},
        "nodes": {},
    }


def paused_entry(cid: str, name: str, at: float) -> dict[str, Any]:
    return {"container_id": cid, "name": name, "task_id": None, "gpu": 0, "paused_at": at,
            "reason": "newcomer"}  # fmt: skip


def make_guard(state_dir: Path, docker_url: str, max_pause_s: float = 120.0) -> Guard:
    state_dir.mkdir(parents=True, exist_ok=True)
    config = GuardConfig(state_dir, docker_url, max_pause_s, lease_timeout_s=2.0, log_level="info")
    return Guard(config, DockerEngine(docker_url), AuditLog(state_dir / AUDIT_FILE))


def test_guard_takes_over_from_a_gone_actuator(
    dockerd: PrivateDockerd, docker_client: Any, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    ours = tenants("ours", MANAGED)
    gone = tenants("gone", MANAGED)
    someone_elses = tenants("else", MANAGED)  # paused by an operator, not in the journal
    atomic_write_json(tmp_path / JOURNAL_FILE, journal_doc(ours, gone))
    gone.remove(force=True)
    guard = make_guard(tmp_path, dockerd.url)
    assert guard.check() == "gone"
    assert not is_paused(docker_client, ours)
    assert is_paused(docker_client, someone_elses)
    assert json.loads((tmp_path / JOURNAL_FILE).read_text())["paused"] == {}
    assert JournalLock(tmp_path).try_acquire(), "the guard gave the lock back"
    records = [r for r in read_audit(tmp_path / AUDIT_FILE) if r["event"] == "guard_resume"]
    results = {r["container_id"]: (r["result"], r.get("skip_reason")) for r in records}
    assert results == {ours.id: ("ok", None), gone.id: ("skipped", "vanished")}


def test_guard_never_writes_the_journal_of_a_live_actuator(
    dockerd: PrivateDockerd, docker_client: Any, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    # The actuator that replaced a dead one holds the journal. Its guard (or a dead one's)
    # may resume, but must never overwrite what the live actuator recorded.
    held = tenants("held", MANAGED)
    atomic_write_json(tmp_path / JOURNAL_FILE, journal_doc(held))
    before = (tmp_path / JOURNAL_FILE).read_bytes()
    replacement = JournalLock(tmp_path)
    assert replacement.try_acquire()
    try:
        lease.renew(tmp_path / lease.ACTUATOR_LEASE)
        guard = make_guard(tmp_path, dockerd.url)
        assert guard.check() == "alive"
        assert is_paused(docker_client, held)  # within --max-pause: the actuator's call
        # Its lease goes stale: stuck. The guard resumes, and still leaves the journal be.
        (tmp_path / lease.ACTUATOR_LEASE).write_text(
            json.dumps({"pid": 1, "renewed": lease.boottime() - 60})
        )
        assert guard.check() == "stuck"
        assert not is_paused(docker_client, held)
        assert (tmp_path / JOURNAL_FILE).read_bytes() == before
        held.pause()  # paused again by hand: the guard resumed it once, and leaves it now
        guard.check()
        assert is_paused(docker_client, held)
    finally:
        replacement.release()


def test_guard_enforces_max_pause_while_the_actuator_lives(
    dockerd: PrivateDockerd, docker_client: Any, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    fresh, overdue = tenants("fresh", MANAGED), tenants("overdue", MANAGED)
    by_actuator = tenants("strict", MANAGED)  # over the actuator's recorded --max-pause
    doc = journal_doc(fresh)
    doc["paused"].update(journal_doc(overdue, paused_at=time.time() - 200)["paused"])
    doc["paused"].update(journal_doc(by_actuator, paused_at=time.time() - 30)["paused"])
    doc["max_pause_s"] = 20.0
    atomic_write_json(tmp_path / JOURNAL_FILE, doc)
    actuator = JournalLock(tmp_path)
    assert actuator.try_acquire()
    try:
        lease.renew(tmp_path / lease.ACTUATOR_LEASE)
        guard = make_guard(tmp_path, dockerd.url, max_pause_s=120)
        for _ in range(3):
            assert guard.check() == "alive"
        assert is_paused(docker_client, fresh)
        assert not is_paused(docker_client, overdue)
        assert not is_paused(docker_client, by_actuator)
        resumes = [r for r in read_audit(tmp_path / AUDIT_FILE) if r["event"] == "guard_resume"]
        resumed = sorted(r["container_id"] for r in resumes)
        assert resumed == sorted([overdue.id, by_actuator.id])  # once each, not per check
    finally:
        actuator.release()


@pytest.mark.parametrize("content", [b"", b'{"version": 1, "paused": {"abc', b"\x00garbage"])
def test_guard_with_an_unreadable_journal_resumes_managed_pauses(
    dockerd: PrivateDockerd,
    docker_client: Any,
    tenants: Callable[..., Any],
    tmp_path: Path,
    content: bytes,
) -> None:
    managed = tenants("managed", MANAGED)
    # a managed tenant claiming a role may have been paused as one: it is resumed too
    claimant = tenants("claimant", {**MANAGED, "gpuguard.role": "exporter"})
    unmanaged = tenants("unmanaged", {"gpuguard.managed": "false"})
    component = tenants("component", {"gpuguard.role": "exporter"})
    (tmp_path / JOURNAL_FILE).write_bytes(content)
    guard = make_guard(tmp_path, dockerd.url)
    assert guard.check() == "gone"  # no crash
    assert not is_paused(docker_client, managed) and not is_paused(docker_client, claimant)
    assert is_paused(docker_client, unmanaged) and is_paused(docker_client, component)
    kept = list(tmp_path.glob(f"{JOURNAL_FILE}.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == content
    assert guard.check() == "gone"  # and the next check is quiet


def test_guard_without_docker_keeps_checking(tmp_path: Path) -> None:
    doc = {"version": 1, "paused": {"c" * 64: paused_entry("c" * 64, "x", 1.0)}}
    atomic_write_json(tmp_path / JOURNAL_FILE, doc)
    guard = make_guard(tmp_path, f"unix://{tmp_path}/no-docker.sock")
    assert guard.check() == "gone"
    assert "c" * 64 in json.loads((tmp_path / JOURNAL_FILE).read_text())["paused"]


def test_actuator_starts_without_docker_and_an_unreadable_journal(
    dockerd: PrivateDockerd, docker_client: Any, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    """No traceback at start; /healthz says why it is degraded; it acts once Docker answers
    (here: undoes every managed pause, since its journal could not be read)."""
    managed = tenants("frozen", MANAGED)
    unmanaged = tenants("left", {"gpuguard.managed": "false"})
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / JOURNAL_FILE).write_bytes(b'{"version": 1, "paused": {"trunc')
    (tmp_path / "token").write_text("t0ken")
    (tmp_path / "token").chmod(0o600)
    engine = tmp_path / "engine.sock"  # nothing there yet: Docker is "down"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = actuator_argv(state_dir, f"unix://{engine}", port, tmp_path / "token")
    actuator = ManagedProcess("actuator", argv, tmp_path / "actuator.log").start()
    try:
        actuator.wait_ready(lambda: requests.get(url + "/healthz", timeout=1).ok, 30)
        wait_for(
            lambda: "docker engine unreachable" in requests.get(url + "/healthz", timeout=5).text,
            20,
            "/healthz to say why",
        )  # it listens before it settles the journal with Docker
        health = requests.get(url + "/healthz", timeout=5).text
        assert health.startswith("degraded: docker engine unreachable"), health
        assert "journal unreadable" in health, health
        assert is_paused(docker_client, managed)
        os.symlink(dockerd.socket, engine)  # Docker answers now
        wait_for(lambda: not is_paused(docker_client, managed), 15, "the managed container resumed")
        assert is_paused(docker_client, unmanaged)
        wait_for(lambda: requests.get(url + "/healthz", timeout=5).text == "ok\n", 10, "ok")
        assert actuator.alive()
        assert "Traceback" not in actuator.log_tail(200)
        assert list(state_dir.glob(f"{JOURNAL_FILE}.corrupt-*"))
    finally:
        actuator.stop()


def test_a_restarted_actuator_listens_at_once_beside_a_hung_docker(tmp_path: Path) -> None:
    """Issue 20, item 4: the guard held the journal's lock through its Docker calls (3
    retries x 5 s per entry against a hung dockerd) and the restarted actuator reconciled
    before it listened: 66 s with 3 journalled pauses. Neither waits on Docker now."""
    from gpuguard.demo.stack.hung_engine import HungEngine

    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    doc = journal_doc()
    for i in range(3):
        cid = f"{i:064x}"
        doc["paused"][cid] = paused_entry(cid, f"rt-{i}", time.time())
    atomic_write_json(state_dir / JOURNAL_FILE, doc)
    (tmp_path / "token").write_text("t0ken")
    (tmp_path / "token").chmod(0o600)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with HungEngine(tmp_path / "hung.sock") as engine:
        guard = ManagedProcess(
            "guard",
            [sys.executable, "-m", "gpuguard.cli", "guard", f"--state.dir={state_dir}",
             f"--docker.host={engine.url}"],
            tmp_path / "guard.log",
        ).start()  # fmt: skip
        actuator = None
        try:
            wait_for(lambda: engine.accepted >= 1, 30, "the guard asking the hung engine")
            argv = actuator_argv(state_dir, engine.url, port, tmp_path / "token")
            started = time.monotonic()
            actuator = ManagedProcess("actuator", argv, tmp_path / "actuator.log").start()
            actuator.wait_ready(lambda: requests.get(url + "/healthz", timeout=1).ok, 30)
            waited = time.monotonic() - started
            assert waited < 10, f"listened after {waited:.1f}s (66 s before the fix)"
            assert guard.alive() and actuator.alive()
        finally:
            if actuator is not None:
                actuator.stop()
            guard.stop()
    assert "Traceback" not in guard.log_tail(200)
