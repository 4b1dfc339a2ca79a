"""Resume first, write later (issue 26, item 2): the guard and a restarted actuator resume a
journalled pause whatever the state directory does to their writes.

Each test puts the actuator's state directory on a fault: a small tmpfs filled up (ENOSPC),
a read-only bind mount (EROFS), or a directory where a lease and ``journal.lock`` go. Its
journal names a real container paused on the private dockerd; the real ``gpuguard guard`` or
``gpuguard actuator`` runs on it, and the container must end up running, with the process
alive, no traceback, each failing file logged once, and its failures counted on /metrics.
Before: the guard renewed its lease first and failed every check there (21 tracebacks in
12 s), the actuator crashed writing its PID into ``journal.lock``, a lease path that was a
directory crashed it with a traceback, and a read-only state directory was refused.

Every mount is undone in a ``finally`` block, after the processes on it are stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuguard.actuator.safety import lease
from gpuguard.actuator.safety.journal import JOURNAL_FILE, atomic_write_json
from gpuguard.actuator.safety.journallock import LOCK_FILE
from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.process import ManagedProcess, free_port
from tests.prereq import unavailable
from tests.support.actuatorcli import actuator_argv
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

MANAGED = {"gpuguard.managed": "true"}
#: the state directory's tmpfs: the journal fits, and then nothing more
TMPFS_SIZE = "256k"


@pytest.fixture
def paused_tenant(docker_client: Any, base_image: str) -> Iterator[Any]:
    """A managed ``sleep`` container, paused as the actuator would have; removed after."""
    container = docker_client.containers.run(
        base_image, ["sleep", "300"], labels=MANAGED, detach=True, network_mode="none",
        name=f"frozen-{os.getpid()}-{time.monotonic_ns()}",
    )  # fmt: skip
    try:
        container.pause()
        yield container
    finally:
        container.remove(force=True)


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        unavailable("mounting a tmpfs or a read-only bind needs root")


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def full_tmpfs(path: Path, setup: Callable[[Path], None]) -> Iterator[Path]:
    """``path`` on a tmpfs of TMPFS_SIZE: ``setup`` writes the state, then it is filled;
    yields the filler (delete it to free the space)."""
    path.mkdir(mode=0o700)
    mount("-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(path))
    try:
        setup(path)
        filler = path / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as handle:
            while True:
                handle.write(b"\0" * 4096)
                handle.flush()
        assert os.statvfs(path).f_bavail == 0, "the tmpfs is not full"
        yield filler
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


@dataclasses.dataclass(frozen=True)
class ReadOnlyState:
    source: Path  # the directory itself
    state: Path  # where the programs see it, read-only
    with_lock: bool  # an earlier actuator left journal.lock there


@pytest.fixture(params=[True, False], ids=["lock-file", "no-lock-file"])
def read_only_state(
    request: pytest.FixtureRequest, as_root: None, paused_tenant: Any, tmp_path: Path
) -> Iterator[ReadOnlyState]:
    """A state directory whose journal names the paused tenant, seen read-only through a
    bind mount (with the ``journal.lock`` an earlier actuator left, or without)."""
    source, state = tmp_path / "source", tmp_path / "state"
    source.mkdir(mode=0o700)
    journal_naming(source, paused_tenant)
    if request.param:
        (source / LOCK_FILE).write_text("1\n")
    state.mkdir(mode=0o700)
    mount("--bind", str(source), str(state))
    try:
        mount("-o", "remount,bind,ro", str(state))
        yield ReadOnlyState(source, state, request.param)
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False, timeout=30)


def journal_naming(state: Path, container: Any) -> None:
    entry = {"container_id": container.id, "name": container.name, "task_id": None, "gpu": 0,
             "paused_at": time.time(), "reason": "newcomer"}  # fmt: skip
    doc = {"version": 1, "pid": 1, "paused": {container.id: entry}}
    atomic_write_json(state / JOURNAL_FILE, doc)


def running(container: Any) -> bool:
    container.reload()
    return bool(container.attrs["State"]["Running"] and not container.attrs["State"]["Paused"])


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one series in a /metrics text, or None."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if labels else "") + r" (\S+)"
    found = re.search(r"^" + pattern + r"$", text, re.MULTILINE)
    return None if found is None else float(found.group(1))


def start_guard(state: Path, docker_url: str, tmp_path: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = [sys.executable, "-m", "gpuguard.cli", "guard", f"--state.dir={state}",
            f"--docker.host={docker_url}", f"--web.listen-address=127.0.0.1:{port}",
            "--lease.timeout=2s"]  # fmt: skip
    guard = ManagedProcess("guard", argv, tmp_path / "guard.log").start()
    url = f"http://127.0.0.1:{port}"
    guard.wait_ready(lambda: requests.get(url + "/healthz", timeout=1).ok, 30)
    return guard, url


def start_actuator(state: Path, docker_url: str, tmp_path: Path) -> tuple[ManagedProcess, str]:
    (tmp_path / "token").write_text("t0ken")
    (tmp_path / "token").chmod(0o600)
    port = free_port()
    argv = actuator_argv(state, docker_url, port, tmp_path / "token")
    actuator = ManagedProcess("actuator", argv, tmp_path / "actuator.log").start()
    url = f"http://127.0.0.1:{port}"
    actuator.wait_ready(lambda: requests.get(url + "/healthz", timeout=1).ok, 30)
    return actuator, url


def metrics(url: str) -> str:
    return requests.get(url + "/metrics", timeout=5).text


def assert_calm(process: ManagedProcess, most: int) -> None:
    """Alive, no traceback, and each failing file logged once per change, not per try."""
    log = process.log_path.read_text(errors="replace")
    assert process.alive(), log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    said = log.count("cannot write the ")
    assert 1 <= said <= most, f"{said} lines about failed writes:\n{log[-3000:]}"


def test_the_guard_resumes_on_a_full_state_disk(
    as_root: None, dockerd: PrivateDockerd, paused_tenant: Any, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with full_tmpfs(state, lambda s: journal_naming(s, paused_tenant)) as filler:
        guard, url = start_guard(state, dockerd.url, tmp_path)
        try:
            wait_for(lambda: running(paused_tenant), 15, "the guard to resume the tenant")
            time.sleep(3)  # six more checks that cannot write: still one line each
            text = metrics(url)
            assert (sample(text, "gpuguard_guard_state_write_failures_total",
                           file="lease", reason="no_space") or 0) >= 3  # fmt: skip
            assert sample(text, "gpuguard_guard_resumed_total") == 1
            assert_calm(guard, most=4)  # the lock, the journal, the lease, the audit log
            assert paused_tenant.id in json.loads((state / JOURNAL_FILE).read_text())["paused"]
            filler.unlink()  # space again: the resume is recorded, nothing resumed twice
            wait_for(
                lambda: json.loads((state / JOURNAL_FILE).read_text())["paused"] == {},
                10,
                "the journal to record the resume",
            )
            assert "journal written again" in guard.log_path.read_text()
            wait_for(lambda: lease.age(state / lease.GUARD_LEASE) < 2, 5, "a renewed lease")
            assert sample(metrics(url), "gpuguard_guard_resumed_total") == 1
        finally:
            guard.stop()


def test_a_restarted_actuator_resumes_on_a_full_state_disk(
    as_root: None, dockerd: PrivateDockerd, paused_tenant: Any, tmp_path: Path
) -> None:
    # No journal.lock yet: the actuator makes it (an inode) and cannot write its PID there.
    state = tmp_path / "state"
    with full_tmpfs(state, lambda s: journal_naming(s, paused_tenant)) as filler:
        actuator, url = start_actuator(state, dockerd.url, tmp_path)
        try:
            wait_for(lambda: running(paused_tenant), 20, "the actuator to resume the tenant")
            health = requests.get(url + "/healthz", timeout=5).text
            assert "cannot write the journal (No space left on device): pausing nothing" in health
            text = metrics(url)
            assert sample(text, "gpuguard_actuator_journal_writable") == 0
            assert (sample(text, "gpuguard_actuator_state_write_failures_total",
                           file="journal", reason="no_space") or 0) >= 1  # fmt: skip
            assert (sample(text, "gpuguard_actuator_state_write_failures_total",
                           file="lock", reason="no_space") or 0) >= 1  # fmt: skip
            time.sleep(2)
            assert_calm(actuator, most=5)  # and the warning that it pauses nothing
            filler.unlink()
            wait_for(
                lambda: json.loads((state / JOURNAL_FILE).read_text())["paused"] == {},
                10,
                "the journal to be written again",
            )
            wait_for(lambda: sample(metrics(url), "gpuguard_actuator_journal_writable") == 1, 5)
            wait_for(lambda: "cannot write" not in requests.get(url + "/healthz", timeout=5).text,
                     5, "/healthz to say nothing fails")  # fmt: skip
            assert (state / LOCK_FILE).read_text().strip().isdigit()  # its PID, written late
        finally:
            actuator.stop()


def test_the_guard_resumes_on_a_read_only_state_dir(
    dockerd: PrivateDockerd, paused_tenant: Any, tmp_path: Path, read_only_state: ReadOnlyState
) -> None:
    # With journal.lock (an actuator ran there) the guard locks it read-only and finds the
    # actuator gone; without one there is nothing to lock, and the stale lease says stuck.
    guard, url = start_guard(read_only_state.state, dockerd.url, tmp_path)
    try:
        wait_for(lambda: running(paused_tenant), 15, "the guard to resume the tenant")
        time.sleep(2)
        text = metrics(url)
        assert (sample(text, "gpuguard_guard_state_write_failures_total",
                       file="lease", reason="read_only") or 0) >= 2  # fmt: skip
        verdict = "gone" if read_only_state.with_lock else "stuck"
        assert sample(text, "gpuguard_guard_actuator", state=verdict) == 1
        assert_calm(guard, most=4)
        assert "not writable (Read-only file system)" in guard.log_path.read_text()
    finally:
        guard.stop()


def test_a_restarted_actuator_resumes_on_a_read_only_state_dir(
    dockerd: PrivateDockerd, paused_tenant: Any, tmp_path: Path, read_only_state: ReadOnlyState
) -> None:
    actuator, url = start_actuator(read_only_state.state, dockerd.url, tmp_path)
    try:
        wait_for(lambda: running(paused_tenant), 20, "the actuator to resume the tenant")
        health = requests.get(url + "/healthz", timeout=5).text
        assert "cannot write the journal" in health and "pausing nothing" in health, health
        text = metrics(url)
        assert sample(text, "gpuguard_actuator_journal_writable") == 0
        assert (sample(text, "gpuguard_actuator_state_write_failures_total",
                       file="lease", reason="read_only") or 0) >= 1  # fmt: skip
        time.sleep(2)
        assert_calm(actuator, most=5)  # lock, journal, lease, audit; pausing nothing
        # still what it found: a read-only journal is never rewritten behind the mount
        journal = json.loads((read_only_state.source / JOURNAL_FILE).read_text())
        assert paused_tenant.id in journal["paused"]
    finally:
        actuator.stop()


def directories_in_the_way(state: Path) -> None:
    for name in (lease.ACTUATOR_LEASE, lease.GUARD_LEASE, LOCK_FILE):
        (state / name).mkdir()
        (state / name / "in-the-way").touch()


@pytest.mark.parametrize("program", ["guard", "actuator"])
def test_leases_and_the_lock_as_directories_are_moved_aside(
    dockerd: PrivateDockerd, paused_tenant: Any, tmp_path: Path, program: str
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    journal_naming(state, paused_tenant)
    directories_in_the_way(state)
    start = start_guard if program == "guard" else start_actuator
    process, _ = start(state, dockerd.url, tmp_path)
    try:
        wait_for(lambda: running(paused_tenant), 20, f"the {program} to resume the tenant")
        own = lease.GUARD_LEASE if program == "guard" else lease.ACTUATOR_LEASE
        wait_for(lambda: lease.age(state / own) < 5, 5, "its lease written as a file")
        kept = sorted(p.name.split(".bad-")[0] for p in state.glob("*.bad-*"))
        assert kept == sorted([LOCK_FILE, own])  # the other's lease is the other's to mend
        log = process.log_path.read_text(errors="replace")
        assert process.alive() and "Traceback" not in log, log[-3000:]
        assert "a directory: moved to" in log
    finally:
        process.stop()
