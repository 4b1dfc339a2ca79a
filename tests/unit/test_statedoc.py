"""The one reader of /api/v1/state (the actuator's and ``gpuguard ps``'s), against what the
exporter really writes: a consumer-driven contract test of docs/interfaces.md section 3."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuguard.commands.ps import ps_rows
from gpuguard.contract import EventType, Phase, PriorityClass, TaskMode
from gpuguard.exporter.activity import ActivityTracker
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.model import DeviceSample, GpuProcess, GpuSample
from gpuguard.exporter.state import state_json
from gpuguard.slo import SloDeclaration
from gpuguard.statedoc import (
    ActivityField,
    ClaimField,
    ContainerField,
    DeviceField,
    GpuField,
    SloField,
    StateError,
    StateField,
    TaskField,
    parse_events,
    parse_state,
)
from tests.unit.exporter_fakes import GIB, cid, container, sample, three_container_poller
from tests.unit.test_launchprobe import proc

REPO = Path(__file__).resolve().parents[2]


def exporter_doc(tmp_path: Path, ended: bool = False) -> dict[str, Any]:
    """The state document of a real poller: three containers, one MIG device; with ``ended``
    one poll later, when the tasks have ended (then in ``recent``)."""
    backend, containers, poller = three_container_poller(tmp_path / "proc")
    rt, _, bad = containers.snapshot().values()
    containers.set(rt, container(2, "train", class_label=PriorityClass.BEST_EFFORT), bad)
    backend.next = sample(1.0, {100: GIB, 200: GIB}, sm={100: 0.5})
    poller.poll_once()
    mig = DeviceSample(1, "MIG-1-2", "gpusim", 10 * GIB, GIB, None, (GpuProcess(200, GIB),),
                       mig_index=2)  # fmt: skip
    backend.next = GpuSample(1.1, (*sample(1.1, {100: GIB}).devices, mig))
    snap = poller.poll_once()
    if ended:
        backend.next = sample(1.5, {})
        snap = poller.poll_once()
    doc: dict[str, Any] = json.loads(json.dumps(state_json(snap)))  # through JSON, as served
    return doc


def test_parses_what_the_exporter_writes(tmp_path: Path) -> None:
    doc = exporter_doc(tmp_path)
    state = parse_state(doc)
    assert [g.key for g in state.gpus] == [(0, None), (1, 2)]
    by_name = {c.name: c for c in state.containers}
    assert by_name["rt-1"].priority_class == PriorityClass.REAL_TIME
    assert by_name["train"].priority_class == PriorityClass.BEST_EFFORT
    assert by_name["rt-1"].task_mode == TaskMode.BURST and by_name["rt-1"].gpus == ("0",)
    assert by_name["rt-1"].demand_sm_ratio is None
    devices = {t.container: t.device for t in state.tasks}
    assert devices == {"rt-1": (0, None), "train": (1, 2)}
    rt_task = next(t for t in state.tasks if t.container == "rt-1")
    assert rt_task.mode == TaskMode.BURST and rt_task.phase == Phase.COMPUTING
    assert rt_task.proc_start_ticks == 500
    assert state.container(cid(2)) is not None


def test_the_exporter_shows_the_devices_each_containers_processes_are_on(
    tmp_path: Path,
) -> None:
    # with or without a task: the actuator gives a real-time container with no task yet
    # the devices its processes are on (its first busy edge freezes its neighbours there)
    by_name = {c.name: c for c in parse_state(exporter_doc(tmp_path)).containers}
    assert by_name["rt-1"].devices == ((0, None),)
    assert by_name["train"].devices == ((1, 2),)
    assert by_name["bad"].devices == ()
    ended = {c.name: c for c in parse_state(exporter_doc(tmp_path / "e", ended=True)).containers}
    assert all(c.devices == () for c in ended.values())  # no process on the GPU any more


def test_reads_the_slo_target_a_container_declares(tmp_path: Path) -> None:
    # admission judges a server by its SLO signal only where it declares one
    backend, containers, poller = three_container_poller(tmp_path / "proc")
    rt, other, bad = containers.snapshot().values()
    containers.set(replace(rt, slo=SloDeclaration("tgi_request_duration", 0.5)), other, bad)
    backend.next = sample(1.0, {100: GIB})
    doc = json.loads(json.dumps(state_json(poller.poll_once())))
    by_name = {c.name: c for c in parse_state(doc).containers}
    assert by_name["rt-1"].slo_target_s == 0.5 and by_name["rt-2"].slo_target_s is None
    del doc["containers"][0]["slo"]["target_s"]
    with pytest.raises(StateError, match=r"containers\[0\].slo.target_s is missing"):
        parse_state(doc)


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("containers", 0, "task_mode"), "Burst", "task_mode 'Burst' is not one of"),
        (("containers", 0, "class"), "besteffort", "class 'besteffort' is not one of"),
        (("containers", 0, "class"), None, "containers[0].class has the wrong type"),
        (("containers", 0, "gpus"), "0", "gpus must be a list"),
        (("containers", 0, "demand_sm_ratio"), "0.4", "demand_sm_ratio has the wrong type"),
        (("tasks", 0, "mode"), "kernel", "tasks[0].mode 'kernel' is not one of"),
        (("tasks", 0, "phase"), "ended", "tasks[0].phase 'ended' is not one of"),
        (("tasks", 0, "mig_index"), True, "mig_index has the wrong type (bool)"),
        (("tasks", 0, "proc_start_ticks"), 1.5, "proc_start_ticks has the wrong type"),
        (("gpus", 1, "mig_index"), "2", "mig_index has the wrong type"),
        (("gpus", 0, "sample_period_s"), 0, "sample_period_s 0.0 is not a period in (0, 10.0]"),
        (("gpus", 0, "sample_period_s"), 1e9, "is not a period"),
    ],
)
def test_rejects_bad_fields(tmp_path: Path, path: tuple[Any, ...], value: Any, needle: str) -> None:
    doc = copy.deepcopy(exporter_doc(tmp_path))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(StateError) as err:
        parse_state(doc)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("section", "key"),
    [("containers", "task_mode"), ("containers", "class"), ("tasks", "mode"),
     ("tasks", "proc_start_ticks")],
)  # fmt: skip
def test_requires_the_fields_admission_relies_on(tmp_path: Path, section: str, key: str) -> None:
    doc = exporter_doc(tmp_path)
    del doc[section][0][key]
    with pytest.raises(StateError, match=f"{section}\\[0\\].{key} is missing"):
        parse_state(doc)


def test_ps_reads_what_the_exporter_writes(tmp_path: Path) -> None:
    rows = ps_rows(parse_state(exporter_doc(tmp_path)))
    cells = ("CONTAINER ID", "DEADLINE", "GPU", "PHASE", "SLACK", "PAUSED")
    # rt-1 computes; train's task on the MIG device shows its parent GPU; bad, with an
    # invalid deadline label and no task, shows the GPUs it was given
    assert {row["NAME"]: tuple(row[c] for c in cells) for row in rows} == {
        "rt-1": (cid(1)[:12], "9s", "0", "computing", "+9.0s", "no"),
        "train": (cid(2)[:12], "-", "1", "starting", "-", "no"),
        "bad": (cid(3)[:12], "invalid", "0", "-", "-", "no"),
    }


def test_the_exporter_writes_the_named_fields_and_no_other(tmp_path: Path) -> None:
    doc = exporter_doc(tmp_path, ended=True)
    assert list(doc) == list(StateField.names())
    assert doc["recent"] and not doc["tasks"]
    (gpu,) = doc["gpus"]
    assert list(gpu) == list(GpuField.names())
    for one in doc["containers"]:
        assert list(one) == list(ContainerField.names())
    running_doc = exporter_doc(tmp_path / "devices")
    for one in running_doc["containers"]:
        for device in one["devices"]:
            assert list(device) == list(DeviceField.names())
    finished = TaskField.names()
    running = tuple(n for n in finished if n not in ("ended_at", "run_s", "met_deadline"))
    for task in doc["recent"]:
        assert list(task) == list(finished)
    assert list(exporter_doc(tmp_path / "running")["tasks"][0]) == list(running)


#: every field set of the state document
FIELD_SETS = (
    StateField,
    GpuField,
    ContainerField,
    SloField,
    ClaimField,
    TaskField,
    ActivityField,
    DeviceField,
)


def test_the_field_names_are_distinct_strings() -> None:
    for fields in FIELD_SETS:
        names = fields.names()
        assert names and len(set(names)) == len(names), fields.__name__
        assert all(re.fullmatch(r"[a-z_]+", name) for name in names), fields.__name__


@pytest.mark.parametrize("fields", FIELD_SETS)
def test_interfaces_doc_shows_every_field(fields: type[StateField]) -> None:
    text = (REPO / "docs" / "interfaces.md").read_text()
    section = re.search(r"^### `GET /api/v1/state`.*?(?=^### )", text, re.S | re.M)
    assert section, "docs/interfaces.md has no /api/v1/state section"
    missing = [name for name in fields.names() if f'"{name}"' not in section.group(0)]
    assert not missing, f"docs/interfaces.md's /api/v1/state lacks {missing}"


def test_an_idle_edge_carries_its_busy_periods_start_to_the_actuator() -> None:
    """The tracker's ``gpu_idle`` as the event stream serves it, read back: its
    ``busy_since``; an event without one (a busy edge) reads None, a bad one is an error."""
    log = EventLog(16)
    tracker = ActivityTracker(log, task_gap_s=0.01, idle_timeout_s=0.5)
    tracker.update(1.0, {"c": [proc(1, 2, last=0.99, period=0.98)]}, [])
    tracker.update(1.1, {"c": [proc(1, 2, last=0.99, period=0.98, waits=1, wait_end=1.02)]}, [])
    batch = log.since(0)
    doc = json.loads(json.dumps({"events": list(batch.events), "next": batch.next,
                                 "truncated": batch.truncated}))  # fmt: skip
    busy, idle = parse_events(doc).events
    assert (busy.type, idle.type) == (EventType.GPU_BUSY, EventType.GPU_IDLE)
    assert busy.busy_since is None and idle.busy_since == pytest.approx(0.98)
    assert idle.ts == pytest.approx(1.02)
    doc["events"][1]["busy_since"] = "soon"
    with pytest.raises(StateError, match="busy_since"):
        parse_events(doc)
