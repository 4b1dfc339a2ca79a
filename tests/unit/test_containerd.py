"""The containerd source: ``ctr`` output parsed from fixtures captured from containerd 1.6
(Debian's), Kubernetes identity and pod labels, and the event-fed cache against a fake ``ctr``.
"""

from __future__ import annotations

import json
import queue
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpuguard.contract import EventType, PriorityClass
from gpuguard.ctr import Ctr, CtrError, parse_task_list, parse_task_pids, trim_info
from gpuguard.exporter.containerd import ContainerdIndex, containers_from_docs, parse_event_line
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.trust import parse_policy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "containerd"
SANDBOX = "a" * 64
CONTAINER = "b" * 64
POD_UID = "11111111-2222-3333-4444-555555555555"


def fixture_doc(name: str) -> dict[str, Any]:
    return trim_info(json.loads((FIXTURES / name).read_text()))


def test_event_lines_of_containers_and_tasks() -> None:
    lines = (FIXTURES / "events.txt").read_text().splitlines()
    events = [e for e in map(parse_event_line, lines) if e is not None]
    assert [(e.topic, e.container_id[:1]) for e in events] == [
        ("/containers/create", "a"),
        ("/tasks/create", "a"),
        ("/tasks/start", "a"),
        ("/containers/create", "b"),
        ("/tasks/create", "b"),
        ("/tasks/start", "b"),
        ("/tasks/paused", "b"),
        ("/tasks/resumed", "b"),
        ("/tasks/exit", "a"),
        ("/tasks/delete", "a"),
        ("/containers/delete", "a"),
    ]  # ctr's own warning line at the end is no event
    assert all(e.namespace == "k8s.io" for e in events)
    assert events[0].ts == pytest.approx(1795602878.246970, abs=1e-5)
    assert events[8].process_id == SANDBOX  # the init process: the task itself ended


@pytest.mark.parametrize(
    "line",
    [
        "",
        "garbage",
        '2026-11-25 10:34:38.2 +0000 UTC k8s.io /images/create {"name":"x"}',
        "2026-11-25 10:34:38.2 +0000 UTC k8s.io /tasks/start not-json",
        '2026-11-25 10:34:38.2 +0000 UTC k8s.io /tasks/start {"pid": 1}',
    ],
)
def test_lines_that_name_no_container_are_skipped(line: str) -> None:
    assert parse_event_line(line) is None


def test_exec_exit_names_its_process() -> None:
    line = (
        f'2026-11-25 10:34:38 -0130 UTC k8s.io /tasks/exit {{"container_id":"{CONTAINER}",'
        '"id":"exec-1","pid":7}'
    )
    event = parse_event_line(line)
    assert event is not None and event.process_id == "exec-1"
    assert event.ts == pytest.approx(1795602878 + 5400)


def test_task_list() -> None:
    assert parse_task_list((FIXTURES / "tasks.txt").read_text()) == {
        SANDBOX: "running",
        CONTAINER: "running",
    }
    assert parse_task_pids((FIXTURES / "tasks.txt").read_text()) == {
        SANDBOX: 14072,
        CONTAINER: 5586,
    }
    assert parse_task_list("TASK PID STATUS\nx 1 PAUSED\ny 2 STOPPED\nz 3 ODD\n") == {
        "x": "paused",
        "y": "exited",
        "z": "unknown",
    }


def test_pod_container_takes_identity_and_pod_labels_from_its_sandbox() -> None:
    docs = {
        SANDBOX: fixture_doc("info_sandbox.json"),
        CONTAINER: fixture_doc("info_container.json"),
    }
    containers = containers_from_docs(docs, {CONTAINER: "paused"})
    assert list(containers) == [CONTAINER]  # the sandbox is the pod's, not a workload
    info = containers[CONTAINER]
    assert (info.name, info.pod_namespace, info.pod_name, info.pod_uid) == (
        "infer",
        "team-a",
        "web-0",
        POD_UID,
    )
    assert info.deadline_s == 2.0 and info.managed  # pod labels, read from the sandbox
    assert info.paused and info.command == "/bin/sleep 1000"


def test_a_pod_containers_own_gpuguard_labels_are_its_images_and_ignored() -> None:
    # containerd's CRI merges the image's LABELs into the container's: not the pod spec's
    sandbox = fixture_doc("info_sandbox.json")
    container = fixture_doc("info_container.json")
    container["Labels"].update({"gpuguard.deadline": "500ms", "gpuguard.class": "best-effort"})
    info = containers_from_docs({SANDBOX: sandbox, CONTAINER: container}, {})[CONTAINER]
    assert info.deadline_s == 2.0 and info.class_label is None and info.state == "created"


def test_container_of_another_pod_gets_no_pod_labels() -> None:
    container = fixture_doc("info_container.json")
    container["Labels"]["io.kubernetes.pod.uid"] = "other"
    docs = {SANDBOX: fixture_doc("info_sandbox.json"), CONTAINER: container}
    info = containers_from_docs(docs, {})[CONTAINER]
    assert info.deadline_s is None and not info.managed


def test_the_trust_policy_matches_the_namespace_its_sandbox_records() -> None:
    """A rule on namespace believes the CRI's sandbox, never what a container says."""
    policy = parse_policy(
        {"version": 1, "rules": [{"match": {"namespace": "team-a"}, "classes": ["real-time"]}]}
    )
    docs = {
        SANDBOX: fixture_doc("info_sandbox.json"),
        CONTAINER: fixture_doc("info_container.json"),
    }
    info = containers_from_docs(docs, {}, policy)[CONTAINER]
    assert info.pod_namespace == "team-a" and info.priority_class == PriorityClass.REAL_TIME
    # a container claiming the namespace without its pod's sandbox: the built-in default
    alone = containers_from_docs({CONTAINER: docs[CONTAINER]}, {}, policy)[CONTAINER]
    assert alone.pod_namespace == "team-a" and alone.priority_class == PriorityClass.NORMAL
    # nor does a container's own label move it to another namespace's rule
    moved = fixture_doc("info_container.json")
    moved["Labels"]["io.kubernetes.pod.namespace"] = "kube-system"
    other = parse_policy(
        {"version": 1, "rules": [{"match": {"namespace": "kube-system"}, "managed": False}]}
    )
    assert containers_from_docs({SANDBOX: docs[SANDBOX], CONTAINER: moved}, {}, other)[
        CONTAINER
    ].managed  # its pod's gpuguard.managed=true: the kube-system rule never applied


def test_container_the_cri_did_not_make_is_named_by_its_id() -> None:
    doc = {"ID": "web", "Labels": {"gpuguard.deadline": "1s"}, "Image": "img", "Args": ["x"],
           "Env": ["NVIDIA_VISIBLE_DEVICES=1"], "CgroupsPath": ""}  # fmt: skip
    info = containers_from_docs({"web": doc}, {"web": "running"})["web"]
    assert (info.name, info.pod_name, info.gpus, info.deadline_s) == ("web", None, ("1",), 1.0)


class FakeEvents:
    """Stands in for the ``ctr events`` child: lines fed by the test, ended on terminate."""

    def __init__(self) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.returncode: int | None = None
        self.stderr = None
        self.stdout = self

    def __iter__(self) -> FakeEvents:
        return self

    def __next__(self) -> str:
        line = self.lines.get()
        if line is None:
            raise StopIteration
        return line

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.returncode = -15
        self.lines.put(None)

    kill = terminate

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode or 0


class FakeCtr(Ctr):
    """containerd as ``ctr`` would answer, from trimmed info documents and task states."""

    def __init__(self) -> None:
        super().__init__("unix:///fake.sock", "k8s.io")
        self.docs: dict[str, dict[str, Any]] = {}
        self.states: dict[str, str] = {}
        self.streams: list[FakeEvents] = []
        self.info_calls = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise CtrError("ctr containers list: connection refused")

    def container_ids(self) -> list[str]:
        self._check()
        return list(self.docs)

    def info(self, container_id: str) -> dict[str, Any]:
        self._check()
        self.info_calls += 1
        if container_id not in self.docs:
            raise CtrError("not found")
        return json.loads(json.dumps(self.docs[container_id]))

    def task_states(self) -> dict[str, str]:
        self._check()
        return dict(self.states)

    def follow_events(self) -> subprocess.Popen[str]:
        self._check()
        stream = FakeEvents()
        self.streams.append(stream)
        return stream  # type: ignore[return-value]

    def event(self, topic: str, container_id: str) -> None:
        body = json.dumps(
            {"container_id": container_id, "id": container_id}
            if topic.startswith("/tasks/")
            else {"id": container_id}
        )
        self.streams[-1].lines.put(f"2026-11-25 10:00:00.5 +0000 UTC k8s.io {topic} {body}\n")


def wait_for(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


@pytest.fixture
def ctr() -> FakeCtr:
    fake = FakeCtr()
    fake.docs[SANDBOX] = fixture_doc("info_sandbox.json")
    fake.states[SANDBOX] = "running"
    return fake


def test_index_follows_events_without_a_call_per_read(ctr: FakeCtr) -> None:
    events = EventLog(64)
    index = ContainerdIndex(ctr, events, backoff_s=(0.01, 0.05)).start()
    try:
        assert index.wait_synced(5) and index.snapshot() == {}
        ctr.docs[CONTAINER] = fixture_doc("info_container.json")
        ctr.event("/containers/create", CONTAINER)
        ctr.states[CONTAINER] = "running"
        ctr.event("/tasks/start", CONTAINER)
        wait_for(
            lambda: CONTAINER in index.snapshot() and index.snapshot()[CONTAINER].state == "running"
        )
        calls = ctr.info_calls
        for _ in range(100):
            assert index.snapshot()[CONTAINER].pod_name == "web-0"
        assert ctr.info_calls == calls  # reads never reach containerd
        ctr.event("/tasks/paused", CONTAINER)
        wait_for(lambda: index.snapshot()[CONTAINER].paused)
        ctr.event("/tasks/resumed", CONTAINER)
        wait_for(lambda: not index.snapshot()[CONTAINER].paused)
        ctr.event("/containers/delete", CONTAINER)
        wait_for(lambda: CONTAINER not in index.snapshot())
        types = [e["type"] for e in events.since(0, 0).events]
        assert types == [
            EventType.CONTAINER_STARTED,
            EventType.CONTAINER_PAUSED,
            EventType.CONTAINER_RESUMED,
            EventType.CONTAINER_REMOVED,
        ]
        assert events.since(0, 0).events[0]["container"] == "infer"
    finally:
        index.stop()


def test_reconnect_resyncs_everything(ctr: FakeCtr) -> None:
    index = ContainerdIndex(ctr, backoff_s=(0.01, 0.05)).start()
    try:
        assert index.wait_synced(5)
        ctr.down = True
        ctr.streams[-1].terminate()  # containerd went away: the stream ends
        wait_for(lambda: not index.connected and index.errors > 0)
        # what happened meanwhile is only learnt from the resync
        ctr.docs[CONTAINER] = fixture_doc("info_container.json")
        ctr.states[CONTAINER] = "paused"
        ctr.down = False
        wait_for(lambda: index.connected and CONTAINER in index.snapshot())
        assert index.snapshot()[CONTAINER].paused and index.last_error is None
        assert len(ctr.streams) >= 2
    finally:
        index.stop()


def test_an_exec_ending_leaves_the_task_running(ctr: FakeCtr) -> None:
    ctr.docs[CONTAINER] = fixture_doc("info_container.json")
    ctr.states[CONTAINER] = "running"
    index = ContainerdIndex(ctr, backoff_s=(0.01, 0.05)).start()
    try:
        assert index.wait_synced(5)
        line = (
            f'2026-11-25 10:00:00 +0000 UTC k8s.io /tasks/exit {{"container_id":"{CONTAINER}",'
            '"id":"exec-1"}\n'
        )
        ctr.streams[-1].lines.put(line)
        ctr.event("/tasks/paused", CONTAINER)  # a later event, to know the first was read
        wait_for(lambda: index.snapshot()[CONTAINER].paused)
        assert index.snapshot()[CONTAINER].state == "paused"
    finally:
        index.stop()


def test_events_of_other_namespaces_are_ignored(ctr: FakeCtr) -> None:
    index = ContainerdIndex(ctr, backoff_s=(0.01, 0.05)).start()
    try:
        assert index.wait_synced(5)
        ctr.docs[CONTAINER] = fixture_doc("info_container.json")
        line = f'2026-11-25 10:00:00 +0000 UTC moby /containers/create {{"id":"{CONTAINER}"}}\n'
        ctr.streams[-1].lines.put(line)
        time.sleep(0.2)
        assert ctr.info_calls == 1  # the sandbox's, at the resync
    finally:
        index.stop()


def test_an_unusable_pod_label_is_logged_once(
    ctr: FakeCtr, caplog: pytest.LogCaptureFixture
) -> None:
    ctr.docs[SANDBOX]["Labels"]["gpuguard.deadline"] = "soon"
    ctr.docs[CONTAINER] = fixture_doc("info_container.json")
    index = ContainerdIndex(ctr, backoff_s=(0.01, 0.05)).start()
    try:
        assert index.wait_synced(5)
        ctr.event("/tasks/paused", CONTAINER)
        wait_for(lambda: index.snapshot()[CONTAINER].paused)
        assert index.snapshot()[CONTAINER].deadline_error
    finally:
        index.stop()
    warnings = [r for r in caplog.records if "label ignored" in r.getMessage()]
    assert len(warnings) == 1 and "infer" in warnings[0].getMessage()
