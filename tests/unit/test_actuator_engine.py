"""The container engine interface: how an engine's answers are read (once, by ``attempt``),
what the executor makes of them, each adapter's translation of its library's errors, and
the one containerd -> container reading the exporter and the actuator share. The adapters
themselves run against a real dockerd and containerd in ``tests/integration/``."""

from __future__ import annotations

import ast
from collections.abc import Callable, Collection
from pathlib import Path

import docker.errors
import pytest
import requests

from gpuguard.actuator.audit import AUDIT_FILE, AuditLog, read_audit
from gpuguard.actuator.decision import PAUSE, UNPAUSE, Step
from gpuguard.actuator.engine.base import Answer, ContainerEngine, ContainerState, attempt, retried
from gpuguard.actuator.engine.containerd import ContainerdEngine
from gpuguard.actuator.engine.docker import (
    DockerEngine,
    _translated,
    state_from_inspect,
    state_from_summary,
)
from gpuguard.actuator.errors import (
    ContainerGone,
    EngineConflict,
    EngineDown,
    EngineError,
    EngineRefused,
)
from gpuguard.actuator.execution.executor import PauseExecutor
from gpuguard.actuator.safety.journal import Journal
from gpuguard.containerd import read_container, read_containers
from gpuguard.contract import Result, SkipReason
from gpuguard.ctr import trim_info

REPO = Path(__file__).resolve().parents[2]
CID = "c" * 64
SANDBOX_LABELS = {
    "io.cri-containerd.kind": "sandbox",
    "io.kubernetes.pod.name": "web-0",
    "io.kubernetes.pod.namespace": "team-a",
    "io.kubernetes.pod.uid": "uid-1",
    "gpuguard.managed": "true",
}
POD_CONTAINER_LABELS = {
    "io.cri-containerd.kind": "container",
    "io.kubernetes.container.name": "infer",
    "io.kubernetes.pod.name": "web-0",
    "io.kubernetes.pod.namespace": "team-a",
    "io.kubernetes.pod.uid": "uid-1",
}


def running(paused: bool = False, up: bool = True) -> ContainerState:
    status = "paused" if paused else "running" if up else "exited"
    return ContainerState(CID, "rt", {"gpuguard.managed": "true"}, status, up, paused, 42)


class ScriptedEngine:
    """An engine whose answers a test sets: ``inspect`` returns (or raises) ``state``;
    ``pause`` and ``unpause`` raise ``errors`` in turn, then succeed. ``meanwhile``: the
    state once a pause or unpause was refused (someone else changed the container)."""

    name = "docker"

    def __init__(self, state: ContainerState | EngineError, errors: list[EngineError]) -> None:
        self.state = state
        self.errors = errors
        self.meanwhile: ContainerState | None = None
        self.calls: list[str] = []

    def ping(self) -> None:
        pass

    def inspect(self, container_id: str) -> ContainerState:
        self.calls.append("inspect")
        if isinstance(self.state, EngineError):
            raise self.state
        return self.state

    def containers(
        self, statuses: Collection[str] | None = None, label: str | None = None
    ) -> list[ContainerState]:
        return []

    def _answer(self, verb: str) -> None:
        self.calls.append(verb)
        if self.errors:
            if self.meanwhile is not None:
                self.state = self.meanwhile
            raise self.errors.pop(0)

    def pause(self, container_id: str) -> None:
        self._answer("pause")

    def unpause(self, container_id: str) -> None:
        self._answer("unpause")


# --- the ladder: what an engine's answer means, read once --------------------------------


def raising(error: EngineError, times: int = 1) -> Callable[[str], str]:
    left = [times]

    def call(container_id: str) -> str:
        if left[0] > 0:
            left[0] -= 1
            raise error
        return "done"

    return call


@pytest.mark.parametrize(
    ("error", "now", "answer", "looked_again"),
    [
        (None, None, Answer.DONE, False),
        (ContainerGone("no such container"), None, Answer.GONE, False),
        (EngineDown("refused", hung=True), None, Answer.DOWN, False),
        (EngineRefused("500 server error"), None, Answer.REFUSED, False),
        # a conflict: the container changed since; how it stands now is looked up
        (EngineConflict("409 is paused"), running(paused=True), Answer.REFUSED, True),
    ],
)
def test_attempt_reads_each_answer_once(
    error: EngineError | None, now: ContainerState | None, answer: Answer, looked_again: bool
) -> None:
    engine = ScriptedEngine(running(paused=True), [])
    call = raising(error, times=5) if error is not None else (lambda container_id: "done")
    tried = attempt(engine, call, CID, delay_s=0.0)
    assert tried.answer is answer
    assert tried.now == now and (engine.calls == ["inspect"]) == looked_again
    assert tried.value == ("done" if answer is Answer.DONE else None)
    assert tried.detail == ("" if error is None else str(error))


def test_attempt_looks_again_only_when_asked_and_a_gone_container_stays_unknown() -> None:
    engine = ScriptedEngine(running(), [])
    conflict = EngineConflict("409")
    assert attempt(engine, raising(conflict), CID, look_again=False).now is None
    assert engine.calls == []
    engine.state = ContainerGone("gone meanwhile")
    assert attempt(engine, raising(conflict), CID, delay_s=0.0).now is None


def test_an_engine_that_does_not_answer_is_asked_again_unless_it_hung() -> None:
    twice = raising(EngineDown("refused"), times=2)
    assert retried(lambda: twice(CID), delay_s=0.0) == "done"
    thrice = raising(EngineDown("refused"), times=3)
    with pytest.raises(EngineDown, match="refused"):
        retried(lambda: thrice(CID), delay_s=0.0)
    calls = []

    def hung() -> None:
        calls.append(1)
        raise EngineDown("read timed out", hung=True)

    with pytest.raises(EngineDown):
        retried(hung, delay_s=0.0)
    assert len(calls) == 1


# --- the executor on those answers (the runtime's pause, no freezer) --------------------


def executor_on(tmp_path: Path, engine: ContainerEngine) -> PauseExecutor:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return PauseExecutor(engine, Journal(state), AuditLog(state / AUDIT_FILE), retry_delay_s=0.0)


@pytest.mark.parametrize(
    ("inspected", "errors", "result", "skip", "journalled", "engine_down"),
    [
        (running(), [], Result.OK, None, True, False),
        (ContainerGone("gone"), [], Result.SKIPPED, SkipReason.VANISHED, False, False),
        (EngineDown("down"), [], Result.FAILED, None, False, True),
        (running(), [ContainerGone("gone")], Result.SKIPPED, SkipReason.VANISHED, False, False),
        # down after the intent was written: unknown whether it took, reconcile settles it
        (running(), [EngineDown("down")] * 3, Result.FAILED, None, True, True),
        (running(), [EngineRefused("500")], Result.FAILED, None, False, False),
    ],
)
def test_a_pause_outcome_follows_the_engines_answer(
    tmp_path: Path,
    inspected: ContainerState | EngineError,
    errors: list[EngineError],
    result: Result,
    skip: SkipReason | None,
    journalled: bool,
    engine_down: bool,
) -> None:
    executor = executor_on(tmp_path, ScriptedEngine(inspected, list(errors)))
    outcome = executor.execute(Step(PAUSE, CID, "rt", "newcomer", gpu=0), "fast")
    assert (outcome.result, outcome.skip_reason) == (result, skip)
    assert (CID in executor.journal.paused, outcome.engine_down) == (journalled, engine_down)
    executor.audit.close()


@pytest.mark.parametrize(
    ("kind", "before", "meanwhile", "result", "skip", "held"),
    [
        # paused meanwhile: held as the journal's intent said
        (PAUSE, running(), running(paused=True), Result.ALREADY, None, True),
        (PAUSE, running(), running(up=False), Result.SKIPPED, SkipReason.VANISHED, False),
        (PAUSE, running(), running(), Result.FAILED, None, False),  # unchanged: refused
        (UNPAUSE, running(paused=True), running(), Result.ALREADY, None, False),
        (UNPAUSE, running(paused=True), running(paused=True), Result.FAILED, None, False),
    ],
)
def test_a_conflict_is_decided_by_how_the_container_stands_after_it(
    tmp_path: Path,
    kind: str,
    before: ContainerState,
    meanwhile: ContainerState,
    result: Result,
    skip: SkipReason | None,
    held: bool,
) -> None:
    engine = ScriptedEngine(before, [EngineConflict("409 conflict")])
    engine.meanwhile = meanwhile
    executor = executor_on(tmp_path, engine)
    outcome = executor.execute(Step(kind, CID, "rt", "admit", gpu=0), "fast")
    assert (outcome.result, outcome.skip_reason) == (result, skip)
    assert engine.calls[-1] == "inspect"  # looked again after the conflict
    assert (CID in executor.journal.paused) == held
    executor.audit.close()


def test_the_audit_names_the_runtimes_pause_and_its_engine(tmp_path: Path) -> None:
    executor = executor_on(tmp_path, ScriptedEngine(running(), []))
    outcome = executor.execute(Step(PAUSE, CID, "rt", "newcomer", gpu=0), "fast")
    assert (outcome.result, outcome.method) == (Result.OK, "runtime_pause")
    executor.audit.close()
    record = read_audit(tmp_path / "state" / AUDIT_FILE)[-1]
    assert (record["method"], record["engine"]) == ("runtime_pause", "docker")


# --- each adapter translates its library's errors, in one place ------------------------


def _response(status: int) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    return response


@pytest.mark.parametrize(
    ("raised", "container_id", "expected"),
    [
        (docker.errors.NotFound("no such container", _response(404)), CID, ContainerGone),
        (docker.errors.NotFound("no such node", _response(404)), None, EngineRefused),
        (docker.errors.APIError("is paused", _response(409)), CID, EngineConflict),
        (docker.errors.APIError("server error", _response(500)), CID, EngineRefused),
        (requests.ConnectionError("refused"), CID, EngineDown),
        (requests.ConnectTimeout("no connection"), CID, EngineDown),
    ],
)
def test_docker_errors_become_gpuguards(
    raised: Exception, container_id: str | None, expected: type[EngineError]
) -> None:
    with pytest.raises(expected) as caught, _translated(container_id):
        raise raised
    assert type(caught.value) is expected
    assert not (isinstance(caught.value, EngineDown) and caught.value.hung)
    with pytest.raises(EngineDown) as timed_out, _translated(CID):
        raise requests.ReadTimeout("no answer")
    assert timed_out.value.hung and "docker engine unreachable" in str(timed_out.value)


def test_docker_documents_read_as_container_states() -> None:
    inspected = {
        "Id": CID, "Name": "/rt-1", "Config": {"Labels": {"gpuguard.managed": "true"}},
        "State": {"Status": "paused", "Running": True, "Paused": True, "Pid": 4242},
    }  # fmt: skip
    assert state_from_inspect(inspected) == ContainerState(
        CID, "rt-1", {"gpuguard.managed": "true"}, "paused", True, True, 4242
    )
    listed = {"Id": CID, "Names": ["/rt-1"], "State": "exited", "Labels": None}
    assert state_from_summary(listed) == ContainerState(CID, "rt-1", {}, "exited", False, False)


def test_both_adapters_have_every_verb_of_the_interface() -> None:
    verbs = {n for n in vars(ContainerEngine) if not n.startswith("_")}
    assert verbs == {"name", "ping", "inspect", "containers", "pause", "unpause"}
    for adapter in (DockerEngine, ContainerdEngine):
        assert verbs <= set(dir(adapter)), adapter


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_the_docker_adapter_imports_docker_py_and_nothing_fakes_a_library() -> None:
    actuator = REPO / "actuator"
    importers = sorted(
        str(path.relative_to(REPO))
        for path in actuator.rglob("*.py")
        if any(name == "docker" or name.startswith("docker.") for name in _imports(path))
    )
    assert importers == ["actuator/engine/docker.py"]
    for path in actuator.rglob("*.py"):
        assert "requests.Response(" not in path.read_text(), path


# --- one containerd -> container reading, shared with the exporter ----------------------


def containerd_doc(cid: str, labels: dict[str, str]) -> dict[str, object]:
    spec = {"process": {"args": ["/bin/sleep", "1000"], "env": ["A=1"]}}
    return trim_info({"ID": cid, "Labels": labels, "Image": "img", "Spec": spec})


def test_a_pod_container_reads_its_name_pod_and_labels_from_its_sandbox() -> None:
    docs = {"s" * 64: containerd_doc("s" * 64, SANDBOX_LABELS),
            CID: containerd_doc(CID, POD_CONTAINER_LABELS)}  # fmt: skip
    found = read_containers(docs, {CID: "paused"}, {CID: 4242, "s" * 64: 1})
    assert list(found) == [CID]  # the sandbox is the pod's, never a workload
    container = found[CID]
    assert (container.name, container.state, container.pid) == ("infer", "paused", 4242)
    assert container.pod is not None and container.pod.namespace == "team-a"
    assert container.labels.get("gpuguard.managed") == "true"  # the pod's label
    assert (container.image, container.args, container.env) == (
        "img",
        ("/bin/sleep", "1000"),
        ("A=1",),
    )
    assert container.running and container.paused


def test_a_container_without_a_task_or_a_pod_is_created_and_named_by_its_id() -> None:
    container = read_container(containerd_doc(CID, {}), "created", 77, None)
    assert (container.name, container.pod, container.pid) == (CID, None, 0)
    assert not container.running and not container.paused
