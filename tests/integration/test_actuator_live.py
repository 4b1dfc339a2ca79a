"""The actuator against a real private dockerd, gpusim, workload containers and exporter.

Every service is a real subprocess stopped by its PID: each actuator, and one guard
(``gpuguard guard``, its own process as deployed) per state directory; every container is
removed by the fixtures.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from exporter_support import (
    ExporterProcess,
    sample_value,
    sim_mounts,
    workload_args,
    workload_log,
)

from gpuguard.actuator.audit import AuditLog, read_audit
from gpuguard.actuator.decision import PAUSE, Step
from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.execution.executor import PauseExecutor
from gpuguard.actuator.safety.journal import Journal
from gpuguard.actuator.safety.lease import GUARD_LEASE
from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.process import ManagedProcess, free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCALE = 0.1  # gpusim kernel time scale: a 13,312 matmul kernel lasts ~1.1 s; copies are real
TOKEN = "integration-token"
MANAGED = {"gpuguard.managed": "true"}


class GuardProcess:
    """``python -m gpuguard.cli guard`` on a state directory, stopped by its PID."""

    def __init__(self, state_dir: Path, docker_url: str, *extra: str) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "gpuguard.cli", "guard", f"--state.dir={state_dir}",
                f"--docker.host={docker_url}", *extra]  # fmt: skip
        self.state_dir = state_dir
        self.process = ManagedProcess("guard", argv, state_dir / "guard.log").start()
        self.process.wait_ready((state_dir / GUARD_LEASE).exists, 30)

    def stop(self) -> None:
        self.process.stop()


class ActuatorProcess:
    """``python -m gpuguard.cli actuator`` on a free port, stopped by its PID."""

    def __init__(self, state_dir: Path, exporter_url: str, docker_url: str, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / "token").write_text(TOKEN)
        self.argv = [
            sys.executable, "-m", "gpuguard.cli", "actuator",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--web.token-file={state_dir / 'token'}",
            f"--exporter.url={exporter_url}",
            f"--docker.host={docker_url}",
            f"--state.dir={state_dir}",
            "--node.name=itest",
            f"--rules.actions={REPO / 'rules' / 'actions.yml'}",
            f"--rules.files={REPO / 'rules' / '*.rules.yml'}",
            *extra,
        ]  # fmt: skip
        self.process: ManagedProcess | None = None

    def start(self) -> ActuatorProcess:
        log = self.state_dir / f"actuator-{self.port}.log"
        self.process = ManagedProcess("actuator", self.argv, log).start()
        self.process.wait_ready(lambda: requests.get(self.url + "/healthz", timeout=1).ok, 30)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def post(self, body: bytes, token: str | None = TOKEN) -> requests.Response:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return requests.post(self.url + "/api/v1/alerts", data=body, headers=headers, timeout=10)

    def audit(self) -> list[dict[str, Any]]:
        return read_audit(self.state_dir / "audit.jsonl")

    def log_tail(self) -> str:
        return self.process.log_tail(60) if self.process else ""


# ``sim`` and ``exporter`` come from conftest.py, at this module's scale and poll interval
@pytest.fixture
def sim_time_scale() -> float:
    return SCALE


@pytest.fixture
def exporter_flags() -> tuple[str, ...]:
    # The private engine's only tenant is the test, whose containers claim real-time by
    # deadline and best-effort, and whose misses must mark the node (test_tasks_live shares
    # this): every claim believed (docs/security.md).
    return ("--poll.interval=20ms", "--trust.all")


@pytest.fixture
def actuator_factory(
    dockerd: PrivateDockerd, exporter: ExporterProcess, tmp_path: Path
) -> Iterator[Callable[..., ActuatorProcess]]:
    """Start an actuator, and a guard on its state directory unless one runs there."""
    made: list[ActuatorProcess] = []
    guards: dict[Path, GuardProcess] = {}

    def start(*extra: str, state_dir: Path | None = None) -> ActuatorProcess:
        state_dir = state_dir or tmp_path / "actuator"
        if state_dir not in guards:
            guards[state_dir] = GuardProcess(state_dir, dockerd.url)
        proc = ActuatorProcess(state_dir, exporter.url, dockerd.url, *extra)
        made.append(proc)
        return proc.start()

    yield start
    for proc in made:  # actuators first: on SIGTERM they resume what they paused
        proc.stop()
    for guard in guards.values():
        guard.stop()


def test_the_actuator_publishes_how_long_its_guard_has_been_silent(
    dockerd: PrivateDockerd, exporter: ExporterProcess, tmp_path: Path
) -> None:
    # GpuguardGuardMissing's input: without a guard, an actuator's death leaves its pauses
    state_dir = tmp_path / "actuator"
    guard = GuardProcess(state_dir, dockerd.url)
    actuator = ActuatorProcess(state_dir, exporter.url, dockerd.url)
    name = "gpuguard_actuator_guard_lease_age_seconds"

    def age() -> float | None:
        text = requests.get(actuator.url + "/metrics", timeout=5).text
        return sample_value(text, name, node="itest")

    try:
        actuator.start()
        wait_for(lambda: (age() or 99.0) < 3.0, 10, "the guard's lease to be seen as fresh")
        guard.stop()
        wait_for(lambda: (age() or 0.0) >= 3.0, 15, "the stopped guard's lease to age")
        assert age() != float("inf"), "the lease file stays: its age, not 'never'"
    finally:
        actuator.stop()
        guard.stop()


def kernel_intervals(sim: GpusimService, names: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Each workload's kernels as (start, end) on the daemon's clock."""
    out = {}
    for name in names:
        events = workload_log(sim, f"{name}.log")
        out[name] = [
            (e["device_started"], e["device_ended"]) for e in events if e["event"] == "kernel_end"
        ]
    return out


def arrival_order(sim: GpusimService, names: list[str]) -> list[str]:
    """The workloads in the order their first contexts were made: first come, first served
    (each was started 0.15 s after the one before, but a loaded machine may wake one late)."""
    made = {
        name: next(
            e["t"] for e in workload_log(sim, f"{name}.log") if e["event"] == "context_created"
        )
        for name in names
    }
    return sorted(names, key=made.__getitem__)


def paused(client: Any, container: Any) -> bool:
    return bool(client.api.inspect_container(container.id)["State"]["Paused"])


def test_fast_path_admits_managed_tasks_one_at_a_time_in_fifo_order(
    sim: GpusimService,
    docker_client: Any,
    run_python_container: Callable[..., Any],
    actuator_factory: Callable[..., ActuatorProcess],
) -> None:
    actuator = actuator_factory("--mode=fast")
    start_at = time.time() + 3.0
    names = [f"fifo-{i}" for i in range(4)]
    # 5 GiB (~0.48 s of input): the window in which a waiting task must be frozen
    size = ("--size", "13312", "--memory-bytes", "5GiB")
    managed = [
        run_python_container(
            workload_args(sim, f"{name}.log", *size, "--start-at", f"{start_at + 0.15 * i:.3f}"),
            labels={**MANAGED, "gpuguard.deadline": "60s"},
            extra_mounts=sim_mounts(sim),
            name=name,
        )
        for i, name in enumerate(names)
    ]
    bystander = run_python_container(
        workload_args(
            sim, "bystander.log", "--size", "4096", "--repeat", "3", "--sleep-between", "1"
        ),
        labels={"gpuguard.managed": "false"},
        extra_mounts=sim_mounts(sim),
        name="bystander",
    )
    bystander_paused = False
    deadline = time.monotonic() + 60
    while any(c.reload() or c.status != "exited" for c in managed):
        assert time.monotonic() < deadline, actuator.log_tail()
        bystander_paused |= bystander.status == "paused" or paused(docker_client, bystander)
        time.sleep(0.05)
    bystander.wait(timeout=30)
    for container in [*managed, bystander]:
        assert container.wait(timeout=5)["StatusCode"] == 0, container.logs().decode()[-2000:]

    kernels = kernel_intervals(sim, names)
    assert all(len(k) == 1 for k in kernels.values()), kernels
    ordered = sorted((k[0], name) for name, k in kernels.items() for k in [k])
    assert [name for _, name in ordered] == arrival_order(sim, names), f"not FIFO: {ordered}"
    for (a, _), (b, _) in itertools.pairwise(ordered):
        assert b[0] >= a[1] - 1e-3, f"two managed kernels overlapped: {a} {b}"

    assert not bystander_paused
    audit = actuator.audit()
    assert not [
        r for r in audit if r.get("container_id") == bystander.id and r["event"] == "action"
    ]
    pauses = [
        r
        for r in audit
        if r["event"] == "action" and r["action"] == "pause" and r["result"] == "ok"
    ]
    # The later three always waited; the first may also have, behind the bystander's task
    # (unmanaged: it occupies the GPU but is never paused).
    assert set(names[1:]) <= {r["container"] for r in pauses} <= set(names)


def _workload_with_waiters(
    sim: GpusimService, run: Callable[..., Any], prefix: str, n: int, work: str
) -> list[Any]:
    start_at = time.time() + 2.5
    return [
        run(
            workload_args(sim, f"{prefix}-{i}.log", "--work-seconds", work,
                          "--memory-bytes", "1GiB", "--start-at", f"{start_at + 0.1 * i:.3f}"),
            labels=MANAGED,
            extra_mounts=sim_mounts(sim),
            name=f"{prefix}-{i}",
        )
        for i in range(n)
    ]  # fmt: skip


def test_kill_9_guard_resumes_and_restart_respects_max_pause(
    sim: GpusimService,
    docker_client: Any,
    run_python_container: Callable[..., Any],
    actuator_factory: Callable[..., ActuatorProcess],
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "crash"
    first = actuator_factory("--mode=fast", state_dir=state_dir)
    # 3 tasks of 40 device-seconds (4 s each at SCALE): two wait paused behind the first.
    workers = _workload_with_waiters(sim, run_python_container, "crash", 3, "40")
    wait_for(
        lambda: sum(paused(docker_client, c) for c in workers) >= 2,
        timeout=20,
        what="two containers paused by the actuator",
        interval=0.05,
    )
    held = {c.id for c in workers if paused(docker_client, c)}
    os.kill(first.pid, signal.SIGKILL)
    wait_for(
        lambda: not any(paused(docker_client, c) for c in workers),
        timeout=10,
        what="the guard resumed every container",
        interval=0.05,
    )

    # The guard writes its audit line after the unpause: wait for it, do not race it.
    def guard_resumed() -> set[str]:
        return {
            r["container_id"]
            for r in first.audit()
            if r["event"] == "guard_resume" and r["result"] == "ok"
        }

    wait_for(lambda: held <= guard_resumed(), 10, "the guard's audit records", interval=0.05)
    wait_for(
        lambda: json.loads((state_dir / "journal.json").read_text())["paused"] == {},
        timeout=10,
        what="the guard emptied the dead actuator's journal",
        interval=0.05,
    )

    # Restart with a short --max-pause: it admits again, but never holds anyone longer.
    second = actuator_factory("--mode=fast", "--max-pause=2s", state_dir=state_dir)
    longest: dict[str, float] = {}
    since: dict[str, float] = {}
    deadline = time.monotonic() + 40
    while any(c.reload() or c.status != "exited" for c in workers):
        assert time.monotonic() < deadline, second.log_tail()
        now = time.monotonic()
        for c in workers:
            if c.status == "paused":
                since.setdefault(c.name, now)
                longest[c.name] = max(longest.get(c.name, 0.0), now - since[c.name])
            else:
                since.pop(c.name, None)
        time.sleep(0.05)
    assert max(longest.values(), default=0.0) <= 2.0 + 1.5, longest
    assert all(c.wait(timeout=5)["StatusCode"] == 0 for c in workers)


def test_bad_requests_and_unknown_targets_change_nothing(
    dockerd: PrivateDockerd,
    docker_client: Any,
    base_image: str,
    actuator_factory: Callable[..., ActuatorProcess],
    tmp_path: Path,
) -> None:
    actuator = actuator_factory("--mode=webhook")
    idle = [
        docker_client.containers.run(
            base_image, ["sleep", "60"], labels=labels, detach=True, network_mode="none",
            name=f"idle-{i}",
        )
        for i, labels in enumerate([MANAGED, {"gpuguard.managed": "false"}])
    ]  # fmt: skip
    try:
        fixtures = REPO / "tests" / "fixtures" / "alertmanager"
        firing = (fixtures / "firing.json").read_bytes()
        assert actuator.post(firing, token="wrong").status_code == 401
        assert actuator.post(firing, token=None).status_code == 401
        assert actuator.post((fixtures / "malformed_types.json").read_bytes()).status_code == 400
        assert actuator.post((fixtures / "wrong_version.json").read_bytes()).status_code == 400
        doc = json.loads(firing)
        doc["alerts"] = [doc["alerts"][0]]
        doc["alerts"][0]["labels"].update(node="itest", gpu="7", container="no-such-container")
        reply = actuator.post(json.dumps(doc).encode())
        assert reply.status_code == 200, reply.text
        assert reply.json()["actions"] == []
        assert {s["reason"] for s in reply.json()["skips"]} == {"irrelevant_alert"}
        assert not [r for r in actuator.audit() if r.get("container_id")]
        metrics = requests.get(actuator.url + "/metrics", timeout=5).text
        assert 'gpuguard_actuator_webhooks_total{code="401"} 2.0' in metrics
        assert 'gpuguard_actuator_webhooks_total{code="400"} 2.0' in metrics

        # The executor re-checks the live container: unknown and unmanaged are skips.
        journal = Journal(tmp_path / "direct")
        audit = AuditLog(tmp_path / "direct" / "audit.jsonl")
        executor = PauseExecutor(DockerEngine(dockerd.url), journal, audit)
        unknown = executor.execute(Step(PAUSE, "f" * 64, "ghost", "newcomer"), "webhook")
        unmanaged = executor.execute(Step(PAUSE, idle[1].id, "idle-1", "newcomer"), "webhook")
        audit.close()
        dry_audit = AuditLog(tmp_path / "dry.jsonl")
        dry = PauseExecutor(DockerEngine(dockerd.url), journal, dry_audit, dry_run=True)
        rehearsed = dry.execute(Step(PAUSE, idle[0].id, "idle-0", "newcomer"), "fast")
        dry.audit.close()
        assert rehearsed.result == "dry_run"
        assert (unknown.result, unknown.skip_reason) == ("skipped", "vanished")
        assert (unmanaged.result, unmanaged.skip_reason) == ("skipped", "unmanaged")
        assert journal.paused == {}
        for container in idle:
            container.reload()
            assert container.status == "running"
    finally:
        for container in idle:
            container.remove(force=True)


def _exporter_down(node: str, status: str = "firing", ends: str = "0001-01-01T00:00:00Z") -> bytes:
    doc = json.loads((REPO / "tests" / "fixtures" / "alertmanager" / "firing.json").read_text())
    labels = {"alertname": "GpuguardExporterDown", "node": node, "severity": "critical",
              "job": "gpuguard-exporter", "instance": "127.0.0.1:10835"}  # fmt: skip
    doc.update(groupKey=f'{{}}:{{alertname="GpuguardExporterDown",node="{node}"}}', status=status)
    doc["alerts"] = [
        {"status": status, "labels": labels, "annotations": {},
         "startsAt": "2025-11-22T01:00:00Z", "endsAt": ends, "generatorURL": "",
         "fingerprint": f"down-{node}"}
    ]  # fmt: skip
    return json.dumps(doc).encode()


def test_resume_all_is_node_scoped_and_idempotent(
    sim: GpusimService,
    docker_client: Any,
    run_python_container: Callable[..., Any],
    actuator_factory: Callable[..., ActuatorProcess],
) -> None:
    actuator = actuator_factory("--mode=both")
    workers = _workload_with_waiters(sim, run_python_container, "hold", 2, "80")
    held = wait_for(
        lambda: next((c for c in workers if paused(docker_client, c)), None),
        timeout=20,
        what="one tenant waiting paused",
        interval=0.05,
    )

    def actions(kind: str) -> list[dict[str, Any]]:
        return [r for r in actuator.audit() if r["event"] == "action" and r.get("action") == kind
                and r.get("container_id") == held.id and r["result"] == "ok"]  # fmt: skip

    # GpuguardExporterDown for another node: nothing happens here.
    assert actuator.post(_exporter_down("elsewhere")).status_code == 200
    time.sleep(1.0)
    assert paused(docker_client, held) and actions("unpause") == []

    # 100 duplicate deliveries for this node (at least once, from two Alertmanagers).
    with ThreadPoolExecutor(max_workers=10) as pool:
        codes = list(pool.map(lambda _: actuator.post(_exporter_down("itest")).status_code,
                              range(100)))  # fmt: skip
    assert codes == [200] * 100
    wait_for(lambda: not paused(docker_client, held), 5, "the held tenant resumed", 0.05)
    time.sleep(2.0)  # the fast path keeps deciding meanwhile
    unpauses, pauses = len(actions("unpause")), len(actions("pause"))
    print(f"\n100 duplicate resume_all deliveries: {unpauses} unpause(s), {pauses} pause(s) "
          "of the held tenant (1 pause before the alert)")  # fmt: skip
    assert (unpauses, pauses) == (1, 1)
    assert not paused(docker_client, held)
    health = requests.get(actuator.url + "/healthz", timeout=5).text
    assert "failing open" in health, health

    resolved = _exporter_down("itest", "resolved", "2025-11-22T01:10:00Z")
    assert actuator.post(resolved).status_code == 200
    assert "failing open" not in requests.get(actuator.url + "/healthz", timeout=5).text
    assert actuator.post(_exporter_down("itest")).status_code == 200  # a late duplicate
    assert "failing open" not in requests.get(actuator.url + "/healthz", timeout=5).text
