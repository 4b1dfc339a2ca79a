"""Pausing through the cgroup, against a real private dockerd and real containers.

Each tenant is a busybox shell counting into ``/tmp/c`` every 10 ms, read from the host
through ``/proc/<pid>/root`` (``tests/support/counting.py``): a counter that stops advancing
is a container that is frozen.
The machines these tests run on are cgroup v1 (the v1 freezer); v2 is covered by the unit
tests' fake trees. Every container is removed, and every process started is stopped by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from gpuguard.actuator.audit import AUDIT_FILE, AuditLog, read_audit
from gpuguard.actuator.decision import PAUSE, UNPAUSE, Step
from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.engine.freezer import (
    FROZEN,
    THAWED,
    Cgroup,
    ContainerFreezer,
    process_state,
)
from gpuguard.actuator.execution.executor import PauseExecutor
from gpuguard.actuator.execution.handover import HANDOVER_AFTER_S
from gpuguard.actuator.safety.journal import JOURNAL_FILE, Journal, PausedEntry
from gpuguard.actuator.safety.lease import GUARD_LEASE
from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.process import ManagedProcess
from tests.prereq import require_cgroup_freezer
from tests.support.counting import counter_script, moved, read_counter, resumes
from tests.unit.actuator_support import make_controller
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

MANAGED = {"gpuguard.managed": "true"}
COUNTER = counter_script("/tmp/c")


@pytest.fixture(autouse=True)
def cgroup_v1_freezer() -> None:
    require_cgroup_freezer()


@pytest.fixture
def tenants(docker_client: Any, base_image: str) -> Iterator[Callable[..., Any]]:
    """Start counting containers with labels; all removed afterwards."""
    made: list[Any] = []

    def start(name: str, labels: dict[str, str]) -> Any:
        container = docker_client.containers.run(
            base_image, ["sh", "-c", COUNTER], labels=labels, detach=True,
            network_mode="none", name=f"{name}-{os.getpid()}",
        )  # fmt: skip
        made.append(container)
        wait_for(lambda: count(container) is not None, 10, f"{name} counting", interval=0.02)
        return container

    yield start
    for container in made:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass


def pid_of(container: Any) -> int:
    return int(container.client.api.inspect_container(container.id)["State"]["Pid"])


def count(container: Any) -> int | None:
    return read_counter(Path(f"/proc/{pid_of(container)}/root/tmp/c"))


def advancing(container: Any, window_s: float = 0.3) -> bool:
    return moved(lambda: count(container), window_s)


def runs(container: Any) -> bool:
    """It counts again (waited for, bounded: a loaded machine may not schedule it at once)."""
    return resumes(lambda: count(container), f"{container.name} to count again")


def cgroup_of(container: Any) -> Cgroup:
    return ContainerFreezer().cgroup(container.id, pid_of(container))


def stopped(container: Any) -> list[int]:
    """Processes of the container in the stopped state (``T``)."""
    out = []
    for pid in cgroup_of(container).pids():
        try:
            if process_state(Path(f"/proc/{pid}/stat").read_text()) == "T":
                out.append(pid)
        except OSError:
            pass
    return out


def docker_paused(container: Any) -> bool:
    return bool(container.client.api.inspect_container(container.id)["State"]["Paused"])


def executor_on(tmp_path: Path, url: str, freezer: ContainerFreezer | None) -> PauseExecutor:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    engine = DockerEngine(url)
    return PauseExecutor(engine, Journal(state), AuditLog(state / AUDIT_FILE), freezer=freezer)


@contextmanager
def engine_calls(engine: DockerEngine, *methods: str) -> Iterator[list[str]]:
    """The names of ``methods`` called on ``engine`` inside the block (still carried out)."""
    called: list[str] = []

    def counted(name: str) -> Callable[..., Any]:
        real = getattr(engine, name)
        return lambda *args: (called.append(name), real(*args))[1]

    for name in methods:
        setattr(engine, name, counted(name))
    try:
        yield called
    finally:
        for name in methods:
            delattr(engine, name)  # the class's own again


def pause(container: Any) -> Step:
    return Step(PAUSE, container.id, container.name, "newcomer", gpu=0)


def unpause(container: Any) -> Step:
    return Step(UNPAUSE, container.id, container.name, "admit", gpu=0)


def test_a_cgroup_freeze_stops_the_container_and_docker_shows_it_paused(
    dockerd: PrivateDockerd, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    tenant = tenants("frozen", MANAGED)
    executor = executor_on(tmp_path, dockerd.url, ContainerFreezer())
    outcome = executor.execute(pause(tenant), "fast")
    assert (outcome.result, outcome.method, outcome.detail) == ("ok", "cgroup", "")
    assert outcome.frozen_at is not None and outcome.freeze_ms is not None
    assert tenant.id in executor.journal.paused
    assert not advancing(tenant)
    executor.settle()  # Docker is told in the background
    assert cgroup_of(tenant).state() == FROZEN and stopped(tenant) == []
    assert docker_paused(tenant), "docker inspect shows it paused"
    records = read_audit(tmp_path / "state" / AUDIT_FILE)
    action = next(r for r in records if r["event"] == "action")
    told = next(r for r in records if r["event"] == "runtime_pause")
    assert action["method"] == "cgroup" and action["frozen"] <= action["finished"]
    assert (told["container_id"], told["result"], told["engine"]) == (tenant.id, "ok", "docker")
    assert told["finished"] >= action["frozen"]

    # An operator's `docker unpause` resumes it: Docker froze it last, Docker thaws it.
    tenant.unpause()
    assert runs(tenant) and stopped(tenant) == []
    assert cgroup_of(tenant).state() == THAWED
    # Reconcile forgets it; the actuator's own unpause finds nothing held.
    assert executor.paused_states([tenant.id]) == {tenant.id: False}
    assert executor.execute(unpause(tenant), "fast").result == "already"
    assert executor.journal.paused == {}


def test_a_brief_freeze_is_never_told_to_docker_and_a_long_one_is(
    dockerd: PrivateDockerd, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    # A best-effort freeze for a busy edge thawed within HANDOVER_AFTER_S is a cgroup write
    # both ways: the thaw never waits for runc's unpause under the controller's lock.
    tenant = tenants("brief", MANAGED)
    executor = executor_on(tmp_path, dockerd.url, ContainerFreezer())
    assert executor.handovers is not None and executor.handovers.after_s == HANDOVER_AFTER_S
    edge = Step(PAUSE, tenant.id, tenant.name, "best_effort", gpu=0)
    assert executor.execute(edge, "fast").result == "ok"
    assert not advancing(tenant, 0.1) and not docker_paused(tenant)
    assert executor.paused_states([tenant.id]) == {tenant.id: True}
    with engine_calls(executor.engine, "inspect", "pause", "unpause") as asked:
        outcome = executor.execute(unpause(tenant), "fast")
    assert (outcome.result, outcome.detail) == ("ok", "")
    assert asked == [], "a cgroup write: nothing asked of Docker"
    assert runs(tenant) and cgroup_of(tenant).state() == THAWED
    assert not docker_paused(tenant) and executor.journal.paused == {}
    told = [r for r in read_audit(tmp_path / "state" / AUDIT_FILE) if r["event"] == "runtime_pause"]
    assert [r["result"] for r in told] == ["cancelled"]
    # One that lasts is handed over on its own, and Docker's unpause thaws it.
    asked = time.monotonic()
    assert executor.execute(edge, "fast").result == "ok"
    wait_for(lambda: docker_paused(tenant), HANDOVER_AFTER_S + 10, "the hand-over to Docker")
    assert time.monotonic() - asked >= HANDOVER_AFTER_S
    assert not advancing(tenant, 0.1)
    assert executor.execute(unpause(tenant), "fast").result == "ok"
    assert runs(tenant) and not docker_paused(tenant) and executor.journal.paused == {}
    # Any other pause (a task's turn, its slack) is told to Docker at once.
    outcome = executor.execute(pause(tenant), "fast")
    assert outcome.result == "ok" and outcome.frozen_at is not None
    wait_for(lambda: docker_paused(tenant), 10, "the hand-over to Docker")
    told = [r for r in read_audit(tmp_path / "state" / AUDIT_FILE) if r["event"] == "runtime_pause"]
    assert told[-1]["started"] - outcome.frozen_at < HANDOVER_AFTER_S / 2, "begun at once"
    assert executor.execute(unpause(tenant), "fast").result == "ok"


def test_a_container_being_handed_to_docker_reads_as_paused(
    dockerd: PrivateDockerd, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    # Between the hand-over's thaw and runc's freeze Docker shows the container running and
    # its cgroup thawed: reconcile read it as "not paused any more" there, forgot it, and
    # the pause that landed next was never undone (the demo hung on it).
    tenant = tenants("handing", MANAGED)
    executor = executor_on(tmp_path, dockerd.url, ContainerFreezer())
    release = threading.Event()
    docker_pause = executor._runtime_pause_frozen

    def slow_docker_pause(container_id: str) -> None:
        assert release.wait(20), "never released"
        docker_pause(container_id)

    executor._runtime_pause_frozen = slow_docker_pause  # type: ignore[method-assign]
    try:
        assert executor.execute(pause(tenant), "fast").result == "ok"
        wait_for(lambda: cgroup_of(tenant).state() == THAWED, 10, "the hand-over's thaw")
        assert not docker_paused(tenant)
        assert executor.paused_states([tenant.id]) == {tenant.id: True}
        assert not advancing(tenant)
    finally:
        release.set()
    executor.settle()
    assert docker_paused(tenant) and executor.paused_states([tenant.id]) == {tenant.id: True}
    assert executor.execute(unpause(tenant), "fast").result == "ok"
    assert runs(tenant) and executor.journal.paused == {}


def test_ten_containers_frozen_at_once(
    dockerd: PrivateDockerd, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    crowd = [tenants(f"crowd-{i}", MANAGED) for i in range(10)]
    executor = executor_on(tmp_path, dockerd.url, ContainerFreezer())
    with ThreadPoolExecutor(max_workers=8) as pool:
        # First pauses inspect each container (none was vetted); the second round reads
        # only their cgroups, all frozen before the first hand-over to Docker begins.
        for round_ in ("inspected", "vetted"):
            outcomes = executor.execute_many([pause(c) for c in crowd], "fast", pool)
            assert [(o.result, o.method) for o in outcomes] == [("ok", "cgroup")] * 10, round_
            assert all(o.detail == "" for o in outcomes), [o.detail for o in outcomes]
            assert not any(advancing(c, 0.05) for c in crowd)
            executor.settle()
            assert all(docker_paused(c) for c in crowd)
            assert all(stopped(c) == [] for c in crowd)
            outcomes = executor.execute_many([unpause(c) for c in crowd], "fast", pool)
            assert [o.result for o in outcomes] == ["ok"] * 10
            assert all(runs(c) for c in crowd) and executor.journal.paused == {}
    records = read_audit(tmp_path / "state" / AUDIT_FILE)
    vetted = [r for r in records if r.get("action") == "pause"][10:]
    told = [r for r in records if r["event"] == "runtime_pause"]
    assert [r["result"] for r in told] == ["ok"] * 20
    last_frozen = max(r["frozen"] for r in vetted)
    assert last_frozen <= min(r["finished"] for r in told[10:]), "all froze before runc ran"


def test_an_unpause_right_after_a_pause_leaves_nothing_held(
    dockerd: PrivateDockerd, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    # Docker is told of each freeze in the background, a couple at a time: an unpause that
    # comes first drops a hand-over not yet begun, or waits for the one under way.
    crowd = [tenants(f"flap-{i}", MANAGED) for i in range(6)]
    executor = executor_on(tmp_path, dockerd.url, ContainerFreezer())
    with ThreadPoolExecutor(max_workers=8) as pool:
        executor.execute_many([pause(c) for c in crowd], "fast", pool)
        outcomes = executor.execute_many([unpause(c) for c in crowd], "fast", pool)
    assert [o.result for o in outcomes] == ["ok"] * 6
    executor.settle()
    for container in crowd:
        assert not docker_paused(container) and cgroup_of(container).state() == THAWED
        assert stopped(container) == [] and runs(container)
    told = [r["result"] for r in read_audit(tmp_path / "state" / AUDIT_FILE)
            if r["event"] == "runtime_pause"]  # fmt: skip
    print(f"\nhand-overs: {sorted(told)}")
    assert len(told) == 6 and set(told) <= {"ok", "cancelled"}
    assert executor.journal.paused == {}


def test_unmanaged_and_gpuguard_containers_are_never_frozen(
    dockerd: PrivateDockerd, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    unmanaged = tenants("unmanaged", {"gpuguard.managed": "false"})
    unlabelled = tenants("unlabelled", {})
    component = tenants("component", {"gpuguard.role": "exporter"})
    executor = executor_on(tmp_path, dockerd.url, ContainerFreezer())
    everyone = [unmanaged, unlabelled, component]
    executor.vet([c.id for c in everyone])  # vetting never makes one pausable
    time.sleep(0.5)
    for _ in range(2):  # a second pause would take the vetted path if the first allowed it
        outcomes = [executor.execute(pause(c), "fast") for c in everyone]
        reasons = [(o.result, o.skip_reason) for o in outcomes]
        assert reasons == [("skipped", "unmanaged")] * 2 + [("skipped", "gpuguard_component")]
    for container in everyone:
        assert cgroup_of(container).state() == THAWED and not docker_paused(container)
        assert runs(container)
    assert executor.journal.paused == {}


def test_a_managed_tenant_claiming_a_gpuguard_role_is_frozen_as_any_tenant(
    dockerd: PrivateDockerd, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    # gpuguard's own containers are never labelled managed: a managed one naming a role is a
    # tenant's claim, which would otherwise make it unpausable and others wait behind it
    claimant = tenants("claimant", {**MANAGED, "gpuguard.role": "exporter"})
    executor = executor_on(tmp_path, dockerd.url, ContainerFreezer())
    assert executor.execute(pause(claimant), "fast").result == "ok"
    assert not advancing(claimant)
    assert executor.execute(unpause(claimant), "fast").result == "ok"
    assert runs(claimant)
    executor.settle()


def test_without_a_usable_cgroup_a_pause_is_docker_pause(
    dockerd: PrivateDockerd, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    tenant = tenants("fallback", MANAGED)
    elsewhere = ContainerFreezer(Path("/proc"), tmp_path / "no-sysfs")
    executor = executor_on(tmp_path, dockerd.url, elsewhere)
    outcome = executor.execute(pause(tenant), "fast")
    assert (outcome.result, outcome.method) == ("ok", "runtime_pause")
    assert docker_paused(tenant) and not advancing(tenant)
    assert executor.execute(unpause(tenant), "fast").result == "ok"
    assert runs(tenant)


# An actuator whose cgroup tree is read-only (systemd's ProtectControlGroups, a container's
# default /sys/fs/cgroup): its own mount namespace, so the host's tree stays writable.
READ_ONLY_CGROUPS = """
import json, sys
from pathlib import Path
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.execution.executor import PauseExecutor
from gpuguard.actuator.execution.handover import HANDOVER_AFTER_S
from gpuguard.actuator.engine.freezer import ContainerFreezer
from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.safety.journal import Journal
from gpuguard.actuator.decision import PAUSE, UNPAUSE, Step

state, url, ids = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
executor = PauseExecutor(
    DockerEngine(url), Journal(state), AuditLog(state / "audit.jsonl"), freezer=ContainerFreezer()
)
done = [executor.execute(Step(PAUSE, cid, cid[:12], "newcomer"), "fast") for cid in ids]
print(json.dumps([[o.result, o.method] for o in done]), flush=True)
input()  # the test looks at the containers meanwhile
done = [executor.execute(Step(UNPAUSE, cid, cid[:12], "admit"), "fast") for cid in ids]
print(json.dumps([o.result for o in done]), flush=True)
"""


def test_a_read_only_cgroup_tree_means_docker_pause(
    dockerd: PrivateDockerd, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    pair = [tenants(f"read-only-{i}", MANAGED) for i in range(2)]
    tree = "/sys/fs/cgroup/freezer" if cgroup_of(pair[0]).version == 1 else "/sys/fs/cgroup"
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    script = [sys.executable, "-c", READ_ONLY_CGROUPS, str(state_dir), dockerd.url]
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount -o remount,bind,ro {tree} && exec "$@"', "sh", *script,
            *(c.id for c in pair)]  # fmt: skip
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdin is not None and child.stdout is not None
        paused = json.loads(child.stdout.readline() or "null")
        # The first is refused by the kernel and paused by Docker; the second is not tried.
        assert paused == [["ok", "runtime_pause"], ["ok", "runtime_pause"]]
        assert all(docker_paused(c) and not advancing(c) for c in pair)
        child.stdin.write("\n")
        child.stdin.flush()
        assert json.loads(child.stdout.readline() or "null") == ["ok", "ok"]
        assert all(runs(c) for c in pair)
        assert child.wait(timeout=10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_reconcile_resumes_a_container_frozen_only_in_its_cgroup(
    dockerd: PrivateDockerd, tenants: Callable[..., Any], tmp_path: Path
) -> None:
    tenant = tenants("reconciled", MANAGED)
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    # What a crash between the cgroup freeze and `docker pause` leaves: the journalled
    # intent, and a cgroup frozen that Docker never heard of.
    Journal(state_dir).will_pause(PausedEntry(tenant.id, tenant.name, None, 0, time.time(), "x"))
    cgroup_of(tenant).freeze()
    assert not advancing(tenant) and not docker_paused(tenant)
    controller = make_controller(tmp_path, dockerd.url)  # a new actuator on that state
    controller.executor.freezer = ContainerFreezer()
    controller.reconcile(None)  # no exporter: nothing held without knowing why
    assert runs(tenant) and cgroup_of(tenant).state() == THAWED
    assert controller.journal.paused == {}
    records = read_audit(state_dir / AUDIT_FILE)
    assert [(r["action"], r["result"], r["reason"]) for r in records if r["event"] == "action"] == [
        ("unpause", "ok", "reconcile")
    ]


# The actuator, killed at the worst moments of a pause: its own executor and freezer, in a
# process of its own holding the journal's lock, stopped for good by a hook at that point.
CRASHING_ACTUATOR = """
import sys, time
from pathlib import Path
from gpuguard.actuator.safety import lease
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.execution.executor import PauseExecutor
from gpuguard.actuator.execution.handover import HANDOVER_AFTER_S
from gpuguard.actuator.engine.freezer import ContainerFreezer
from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.safety.journal import Journal
from gpuguard.actuator.safety.journallock import JournalLock
from gpuguard.actuator.decision import PAUSE, Step

state, url, cid, crash_at = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
lock = JournalLock(state)
lock.acquire()
lease.renew(state / lease.ACTUATOR_LEASE)

def hang(*args, **kwargs):
    print("hung", flush=True)
    time.sleep(3600)

engine, freezer = DockerEngine(url), ContainerFreezer()
if crash_at == "before_handover":
    freezer.handover = hang  # frozen in its cgroup; Docker never told
else:
    engine.pause = hang  # inside the hand-over: processes stopped, cgroup thawed, no runc yet
executor = PauseExecutor(engine, Journal(state), AuditLog(state / "audit.jsonl"), freezer=freezer)
executor.execute(Step(PAUSE, cid, "tenant", "newcomer"), "fast")
time.sleep(3600)  # the hand-over to Docker hangs in its own thread
"""


@pytest.mark.parametrize("crash_at", ["before_handover", "inside_handover"])
def test_the_guard_resumes_what_a_killed_actuator_froze_in_the_cgroup(
    dockerd: PrivateDockerd, tenants: Callable[..., Any], tmp_path: Path, crash_at: str
) -> None:
    tenant = tenants(f"crash-{crash_at.split('_')[0]}", MANAGED)
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    guard_argv = [sys.executable, "-m", "gpuguard.cli", "guard", f"--state.dir={state_dir}",
                  f"--docker.host={dockerd.url}"]  # fmt: skip
    guard = ManagedProcess("guard", guard_argv, tmp_path / "guard.log").start()
    actuator = subprocess.Popen(
        [sys.executable, "-c", CRASHING_ACTUATOR, str(state_dir), dockerd.url, tenant.id,
         crash_at],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        guard.wait_ready((state_dir / GUARD_LEASE).exists, 30)
        assert actuator.stdout is not None and actuator.stdout.readline() == "hung\n"
        assert not advancing(tenant) and not docker_paused(tenant)
        if crash_at == "inside_handover":
            assert cgroup_of(tenant).state() == THAWED and stopped(tenant)
        else:
            assert cgroup_of(tenant).state() == FROZEN
        time.sleep(1.0)
        assert not advancing(tenant), "the guard leaves a live actuator's pause alone"
        os.kill(actuator.pid, signal.SIGKILL)
        actuator.wait(timeout=10)
        resumes(lambda: count(tenant), "the guard resumed the tenant")
        assert stopped(tenant) == [] and cgroup_of(tenant).state() == THAWED
        wait_for(
            lambda: json.loads((state_dir / JOURNAL_FILE).read_text())["paused"] == {},
            10,
            "the guard emptied the dead actuator's journal",
            0.05,
        )
        resumed = [r for r in read_audit(state_dir / AUDIT_FILE) if r["event"] == "guard_resume"]
        assert [(r["container_id"], r["result"]) for r in resumed] == [(tenant.id, "ok")]
    finally:
        if actuator.poll() is None:
            actuator.kill()
            actuator.wait()
        guard.stop()
