"""Admission without Docker: the actuator's executor and the guard on a real private
containerd (``gpuguard/actuator/engine/containerd.py``), pods made as the kubelet makes them.

Each tenant is a busybox shell counting into its own file every 10 ms, read from the host through
``/proc/<pid>/root``: a counter that stops advancing is a container that is frozen.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from containerd_support import Pod

from gpuguard.actuator.audit import AUDIT_FILE, AuditLog, read_audit
from gpuguard.actuator.decision import PAUSE, UNPAUSE, Step
from gpuguard.actuator.engine.containerd import ContainerdEngine
from gpuguard.actuator.engine.freezer import FROZEN, THAWED, ContainerFreezer
from gpuguard.actuator.execution.executor import PauseExecutor
from gpuguard.actuator.safety.journal import JOURNAL_FILE, Journal
from gpuguard.actuator.safety.lease import GUARD_LEASE
from gpuguard.actuator.safety.resume import resume_managed_paused
from gpuguard.ctr import Ctr
from gpuguard.demo.stack.containerd import PrivateContainerd
from gpuguard.demo.stack.process import ManagedProcess
from tests.prereq import require_cgroup_freezer
from tests.support.counting import counter_script, moved, read_counter, resumes
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

# $0 is the container's name: its own file in the root filesystem the pods share
COUNTER = counter_script("/tmp/c-$0")


@pytest.fixture(autouse=True)
def cgroup_freezer() -> None:
    require_cgroup_freezer()


def engine_of(containerd: PrivateContainerd) -> ContainerdEngine:
    return ContainerdEngine(Ctr(containerd.address, "k8s.io"))


def counting(pod: Pod, name: str) -> str:
    cid = pod.run_command(name, ["/bin/sh", "-c", COUNTER, f"{pod.name}-{name}"])
    wait_for(lambda: count(pod, name) is not None, 10, f"{name} counting", interval=0.02)
    return cid


def count(pod: Pod, name: str) -> int | None:
    return read_counter(Path(f"/proc/{pod.task_pid(name)}/root/tmp/c-{pod.name}-{name}"))


def advancing(pod: Pod, name: str, window_s: float = 0.3) -> bool:
    return moved(lambda: count(pod, name), window_s)


def runs(pod: Pod, name: str) -> bool:
    """It counts again (waited for, bounded: a loaded machine may not schedule it at once)."""
    return resumes(lambda: count(pod, name), f"{pod.name}-{name} to count again")


def task_status(containerd: PrivateContainerd, cid: str) -> str:
    for line in containerd.check("tasks", "list").splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == cid:
            return fields[2]
    return "none"


def executor_on(state: Path, containerd: PrivateContainerd) -> PauseExecutor:
    state.mkdir(exist_ok=True)
    return PauseExecutor(
        engine_of(containerd), Journal(state), AuditLog(state / AUDIT_FILE),
        freezer=ContainerFreezer(),
    )  # fmt: skip


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
def test_a_pod_managed_by_its_label_is_frozen_then_handed_to_containerd(
    containerd: PrivateContainerd, pods: Callable[..., Pod], tmp_path: Path, driver: str
) -> None:
    pod = pods(f"rt-{driver}", driver, {"gpuguard.managed": "true"})
    cid = counting(pod, "server")
    executor = executor_on(tmp_path / "state", containerd)
    outcome = executor.execute(Step(PAUSE, cid, "server", "newcomer", gpu=0), "fast")
    assert (outcome.result, outcome.method, outcome.detail) == ("ok", "cgroup", "")
    assert cid in executor.journal.paused
    assert not advancing(pod, "server")
    executor.settle()  # containerd is told in the background
    assert task_status(containerd, cid) == "PAUSED"  # what `ctr tasks list` shows
    cgroup = ContainerFreezer().cgroup(cid, pod.task_pid("server"))
    assert cgroup.state() == FROZEN
    told = [r for r in read_audit(tmp_path / "state" / AUDIT_FILE) if r["event"] == "runtime_pause"]
    assert [(r["container_id"], r["result"], r["engine"]) for r in told] == [
        (cid, "ok", "containerd")
    ]

    assert executor.paused_states([cid, "f" * 64]) == {cid: True, "f" * 64: None}  # reconcile

    outcome = executor.execute(Step(UNPAUSE, cid, "server", "admit", gpu=0), "fast")
    assert outcome.result == "ok" and executor.journal.paused == {}
    assert executor.paused_states([cid]) == {cid: False}
    assert runs(pod, "server") and cgroup.state() == THAWED
    assert task_status(containerd, cid) == "RUNNING"


def test_an_unmanaged_pod_and_a_vanished_container_are_skipped(
    containerd: PrivateContainerd, pods: Callable[..., Pod], tmp_path: Path
) -> None:
    pod = pods("batch", "cgroupfs", {})
    cid = counting(pod, "train")
    executor = executor_on(tmp_path / "state", containerd)
    outcome = executor.execute(Step(PAUSE, cid, "train", "newcomer"), "fast")
    assert (outcome.result, outcome.skip_reason) == ("skipped", "unmanaged")
    assert runs(pod, "train")
    outcome = executor.execute(Step(PAUSE, "f" * 64, "gone", "newcomer"), "fast")
    assert (outcome.result, outcome.skip_reason) == ("skipped", "vanished")
    assert executor.journal.paused == {}


def test_a_lost_journal_resumes_every_managed_pod_container_and_nothing_else(
    containerd: PrivateContainerd, pods: Callable[..., Pod], tmp_path: Path
) -> None:
    managed = pods("held", "cgroupfs", {"gpuguard.managed": "true"})
    other = pods("operator", "cgroupfs", {})
    held, kept = counting(managed, "server"), counting(other, "batch")
    containerd.check("tasks", "pause", held)
    containerd.check("tasks", "pause", kept)  # an operator's pause of an unmanaged pod
    audit = AuditLog(tmp_path / AUDIT_FILE)
    resumed = resume_managed_paused(
        engine_of(containerd), audit, "journal lost", ContainerFreezer()
    )
    assert resumed == [held]
    assert task_status(containerd, held) == "RUNNING" and runs(managed, "server")
    assert task_status(containerd, kept) == "PAUSED"
    containerd.check("tasks", "resume", kept)


CRASHING_ACTUATOR = """
import sys, time
from pathlib import Path
from gpuguard.actuator.safety import lease
from gpuguard.actuator.audit import AuditLog
from gpuguard.actuator.engine.containerd import ContainerdEngine
from gpuguard.actuator.execution.executor import PauseExecutor
from gpuguard.actuator.engine.freezer import ContainerFreezer
from gpuguard.actuator.safety.journal import Journal
from gpuguard.actuator.safety.journallock import JournalLock
from gpuguard.actuator.decision import PAUSE, Step
from gpuguard.ctr import Ctr

state, address, cid = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
lock = JournalLock(state)
lock.acquire()
lease.renew(state / lease.ACTUATOR_LEASE)

def hang(*args, **kwargs):
    print("hung", flush=True)
    time.sleep(3600)

freezer = ContainerFreezer()
freezer.handover = hang  # frozen in its cgroup; containerd never told
engine = ContainerdEngine(Ctr(address, "k8s.io"))
executor = PauseExecutor(engine, Journal(state), AuditLog(state / "audit.jsonl"), freezer=freezer)
executor.execute(Step(PAUSE, cid, "tenant", "newcomer"), "fast")
time.sleep(3600)
"""


def test_the_guard_resumes_what_a_killed_actuator_froze(
    containerd: PrivateContainerd, pods: Callable[..., Pod], tmp_path: Path
) -> None:
    pod = pods("crash", "systemd", {"gpuguard.managed": "true"})
    cid = counting(pod, "tenant")
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    guard_argv = [sys.executable, "-m", "gpuguard.cli", "guard", f"--state.dir={state_dir}",
                  f"--containerd.address={containerd.address}"]  # fmt: skip
    guard = ManagedProcess("guard", guard_argv, tmp_path / "guard.log").start()
    actuator = subprocess.Popen(
        [sys.executable, "-c", CRASHING_ACTUATOR, str(state_dir), containerd.address, cid],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        guard.wait_ready((state_dir / GUARD_LEASE).exists, 30)
        assert actuator.stdout is not None and actuator.stdout.readline() == "hung\n"
        assert not advancing(pod, "tenant") and task_status(containerd, cid) == "RUNNING"
        time.sleep(1.0)
        assert not advancing(pod, "tenant"), "the guard leaves a live actuator's pause alone"
        os.kill(actuator.pid, signal.SIGKILL)
        actuator.wait(timeout=10)
        resumes(lambda: count(pod, "tenant"), "the guard resumed the tenant")
        wait_for(
            lambda: json.loads((state_dir / JOURNAL_FILE).read_text())["paused"] == {},
            10,
            "the guard emptied the dead actuator's journal",
            0.05,
        )
        resumed = [r for r in read_audit(state_dir / AUDIT_FILE) if r["event"] == "guard_resume"]
        assert [(r["container_id"], r["result"]) for r in resumed] == [(cid, "ok")]
    finally:
        if actuator.poll() is None:
            actuator.kill()
            actuator.wait()
        guard.stop()
