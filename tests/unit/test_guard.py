"""The guard against hostile state, without Docker (the engine is an address where nothing
listens): it must neither crash, nor hang, nor hold the journal's lock while it waits."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.actuator.audit import AUDIT_FILE, AuditLog, read_audit
from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.guard.program import Guard, GuardConfig
from gpuguard.actuator.safety import lease
from gpuguard.actuator.safety.journal import JOURNAL_FILE, Journal, PausedEntry
from gpuguard.actuator.safety.journallock import JournalLock
from tests.support.tlscerts import Pki
from tests.unit.engine_fakes import FakeEngine


@pytest.fixture
def guard(tmp_path: Path) -> Iterator[Guard]:
    config = GuardConfig(tmp_path, None, 120.0, lease_timeout_s=15.0, log_level="info")
    audit = AuditLog(tmp_path / AUDIT_FILE)
    yield Guard(config, DockerEngine(f"unix://{tmp_path}/no-docker.sock"), audit)
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


def test_the_guard_does_not_hold_the_journal_through_docker_calls(tmp_path: Path) -> None:
    # Issue 20, item 4: with a hung dockerd each entry cost 3 retries x 5 s under the lock,
    # and a restarted actuator waited 66 s (3 entries) before it could even start.
    now = time.time()
    journal = Journal(tmp_path)
    journal.will_pause_many(
        [PausedEntry(f"{i:064x}", f"rt-{i}", None, 0, now, "newcomer") for i in range(3)]
    )
    engine = FakeEngine(delay=0.5)  # a hung or overloaded dockerd, short of its timeout
    config = GuardConfig(tmp_path, None, 120.0, lease_timeout_s=15.0, log_level="info")
    audit = AuditLog(tmp_path / AUDIT_FILE)
    guard = Guard(config, engine, audit)
    checking = threading.Thread(target=guard.check)
    checking.start()
    try:
        time.sleep(0.3)  # the guard is inside its first Docker call
        actuator = JournalLock(tmp_path)
        started = time.monotonic()
        assert actuator.try_acquire(), "the guard holds the journal while it waits for Docker"
        assert time.monotonic() - started < 0.1
        actuator.release()
    finally:
        checking.join(10)
        audit.close()
    assert len(engine.unpaused) == 3
    assert json.loads((tmp_path / JOURNAL_FILE).read_text())["paused"] == {}


def test_the_guard_stops_at_the_first_unreachable_docker_call(guard: Guard, tmp_path: Path) -> None:
    now = time.time()
    Journal(tmp_path).will_pause_many(
        [PausedEntry(f"{i:064x}", f"rt-{i}", None, 0, now, "newcomer") for i in range(5)]
    )
    calls = []
    engine = guard.engine

    class Counting:
        def __getattr__(self, name: str) -> object:
            calls.append(name)
            return getattr(engine, name)

    guard.engine = Counting()  # type: ignore[assignment]
    assert check_in_time(guard) == "gone"
    assert calls.count("inspect") <= 3  # one entry's retries, not 5 x 3
    assert len(json.loads((tmp_path / JOURNAL_FILE).read_text())["paused"]) == 5


def test_a_hung_engine_is_not_asked_three_times(tmp_path: Path) -> None:
    # A timeout on an engine that accepted the request will time out again: retrying it
    # only multiplied the wait (3 x 5 s per call). A refused connection is still retried.
    from gpuguard.actuator.engine.base import retried
    from gpuguard.actuator.errors import EngineDown
    from gpuguard.demo.stack.hung_engine import HungEngine

    calls = []
    with HungEngine(tmp_path / "hung.sock") as hung:
        engine = DockerEngine(hung.url, timeout_s=1)

        def ping_hung() -> None:
            calls.append(1)
            engine.ping()

        with pytest.raises(EngineDown) as raised:
            retried(ping_hung, retries=3, delay_s=0.0)
        assert raised.value.hung and len(calls) == 1

    refusing = DockerEngine(f"unix://{tmp_path}/refused.sock")

    def ping_refused() -> None:
        calls.append(1)
        refusing.ping()

    calls.clear()
    with pytest.raises(EngineDown, match="docker engine unreachable") as raised:
        retried(ping_refused, retries=3, delay_s=0.0)
    assert not raised.value.hung and len(calls) == 3


def test_the_guard_publishes_what_it_sees(guard: Guard, tmp_path: Path) -> None:
    # Issue 20, item 9: GpuguardGuardMissing came only from the actuator's gauge, so with
    # both dead nothing said the tenants it paused would stay paused. The guard is scraped
    # itself now (job gpuguard-guard): its `up`, and what it knows of the actuator.
    from prometheus_client import CollectorRegistry

    from gpuguard.actuator.guard.metrics import GuardCollector

    registry = CollectorRegistry()
    registry.register(GuardCollector(guard))
    Journal(tmp_path).will_pause(PausedEntry("c" * 64, "rt", None, 0, time.time(), "newcomer"))
    assert check_in_time(guard) == "gone"

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("gpuguard_guard_actuator_lease_age_seconds") == math.inf  # none ever
    assert value("gpuguard_guard_actuator", state="gone") == 1
    assert value("gpuguard_guard_actuator", state="alive") == 0
    assert value("gpuguard_guard_journal_paused_containers") == 1  # Docker is unreachable
    assert value("gpuguard_guard_docker_up") == 0
    assert time.time() - (value("gpuguard_guard_last_check_timestamp_seconds") or 0) < 5


def test_the_guard_serves_its_metrics(tmp_path: Path) -> None:
    import requests

    from gpuguard.actuator.guard.metrics import guard_server
    from gpuguard.actuator.guard.program import FLAGS, validate
    from gpuguard.demo.stack.process import free_port

    port = free_port()
    config = validate(
        {f.name: f.default for f in FLAGS}
        | {"state.dir": str(tmp_path), "web.listen-address": f"127.0.0.1:{port}"}
    )
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", port)
    audit = AuditLog(tmp_path / AUDIT_FILE)
    guard = Guard(config, DockerEngine(f"unix://{tmp_path}/none.sock"), audit)
    server = guard_server(guard, config.listen_host, config.listen_port)
    assert server is not None
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "gpuguard_guard_last_check_timestamp_seconds" in text
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        assert (
            guard_server(guard, config.listen_host, config.listen_port) is None
        )  # the port is taken: logged, and it guards on
    finally:
        server.shutdown()
        server.server_close()
        audit.close()


def test_the_guard_serves_its_metrics_over_tls_with_basic_auth(pki: Pki, tmp_path: Path) -> None:
    # Its port is reachable by tenants like the others: the same --web.config.file.
    import requests

    from gpuguard.actuator.errors import ConfigError
    from gpuguard.actuator.guard.metrics import guard_server
    from gpuguard.actuator.guard.program import FLAGS, validate
    from gpuguard.demo.stack.process import free_port
    from gpuguard.web.webconfig import WebConfigWatcher
    from tests.support.tlscerts import write_web_config

    web = write_web_config(tmp_path / "web.yml", pki, {"prometheus": "right"})
    port = free_port()
    base = {f.name: f.default for f in FLAGS} | {"state.dir": str(tmp_path / "state")}
    bad = tmp_path / "bad.yml"
    bad.write_text("tls_server_config: {cert_file: /nonexistent.crt, key_file: /x.key}\n")
    with pytest.raises(ConfigError, match="cert_file"):
        validate(base | {"web.config.file": str(bad)})
    assert not (tmp_path / "state").exists()  # a bad flag leaves nothing behind
    config = validate(
        base | {"web.listen-address": f"127.0.0.1:{port}", "web.config.file": str(web)}
    )
    assert config.web is not None and config.web.scheme == "https"
    audit = AuditLog(tmp_path / AUDIT_FILE)
    guard = Guard(config, DockerEngine(f"unix://{tmp_path}/none.sock"), audit)
    server = guard_server(guard, "127.0.0.1", port, WebConfigWatcher(config.web))
    assert server is not None
    try:
        url = f"https://127.0.0.1:{port}/metrics"
        ok = requests.get(url, verify=str(pki.ca), auth=("prometheus", "right"), timeout=10)
        assert ok.status_code == 200 and "gpuguard_guard_last_check_timestamp_seconds" in ok.text
        assert "gpuguard_web_config_last_reload_successful 1.0" in ok.text
        assert requests.get(url, verify=str(pki.ca), timeout=10).status_code == 401
        with pytest.raises(requests.ConnectionError):  # no plain HTTP beside it
            requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    finally:
        server.shutdown()
        server.server_close()
        audit.close()
