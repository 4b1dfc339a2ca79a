from __future__ import annotations

from typing import Any

import pytest

from gpuguard.exporter.containers import container_info, gpus_from_config

ID = "ab" * 32


def inspect_doc(labels: dict[str, str] | None = None, **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "Id": ID,
        "Name": "/rt-1",
        "Path": "python3",
        "Args": ["-m", "gpusim.workload"],
        "State": {"Status": "running"},
        "Config": {"Image": "gpuguard/base:local", "Labels": labels or {}, "Env": []},
        "HostConfig": {"DeviceRequests": None},
    }
    doc.update(overrides)
    return doc


def test_container_info_from_inspect() -> None:
    labels = {
        "gpuguard.deadline": "1500ms",
        "gpuguard.managed": "true",
        "gpuguard.role": "actuator",
    }
    info = container_info(inspect_doc(labels))
    assert (info.id, info.name, info.image, info.state) == (
        ID,
        "rt-1",
        "gpuguard/base:local",
        "running",
    )
    assert info.deadline_s == 1.5 and info.deadline_error is None
    assert info.managed and info.role == "actuator" and not info.paused
    assert info.command == "python3 -m gpusim.workload"
    assert info.short_id == ID[:12]


def test_invalid_deadline_is_reported_not_raised() -> None:
    info = container_info(inspect_doc({"gpuguard.deadline": "soon"}))
    assert info.deadline_s is None and "invalid duration" in (info.deadline_error or "")


@pytest.mark.parametrize(
    ("labels", "mode", "klass"),
    [
        ({}, None, "normal"),
        ({"gpuguard.deadline": "2s"}, None, "real-time"),
        ({"gpuguard.task": "memory", "gpuguard.class": "best-effort"}, "memory", "best-effort"),
        ({"gpuguard.task": "process", "gpuguard.deadline": "2s", "gpuguard.class": "normal"},
         "process", "normal"),
    ],
)  # fmt: skip
def test_task_mode_and_class(labels: dict[str, str], mode: str | None, klass: str) -> None:
    info = container_info(inspect_doc(labels))
    assert info.task_mode == mode and info.priority_class == klass
    assert info.task_mode_error is None and info.class_error is None


def test_invalid_task_and_class_are_reported_and_ignored() -> None:
    labels = {"gpuguard.task": "Burst", "gpuguard.class": "besteffort", "gpuguard.deadline": "1s"}
    info = container_info(inspect_doc(labels))
    assert info.task_mode is None
    assert "invalid gpuguard.task 'Burst'" in (info.task_mode_error or "")
    assert info.class_label is None and "gpuguard.class" in (info.class_error or "")
    assert info.priority_class == "real-time"  # as if the bad label were absent


def test_unlabelled_and_paused() -> None:
    info = container_info(inspect_doc(State={"Status": "paused"}, Config={"Image": "x"}))
    assert info.paused and not info.managed and info.deadline_s is None and info.gpus == ()


@pytest.mark.parametrize(
    ("requests", "env", "gpus"),
    [
        ([{"Driver": "nvidia", "Count": -1, "DeviceIDs": None}], [], ("all",)),
        ([{"Driver": "nvidia", "Count": 0, "DeviceIDs": ["0", "2"]}], [], ("0", "2")),
        ([{"Driver": "", "Count": 2, "Capabilities": [["gpu"]]}], [], ("0", "1")),
        ([{"Driver": "other", "Count": -1}], [], ()),
        (None, ["NVIDIA_VISIBLE_DEVICES=1,GPU-abc"], ("1", "GPU-abc")),
        (None, ["NVIDIA_VISIBLE_DEVICES=all"], ("all",)),
        (None, ["NVIDIA_VISIBLE_DEVICES=void"], ()),
        (None, ["PATH=/bin"], ()),
    ],
)
def test_gpus(requests: Any, env: list[str], gpus: tuple[str, ...]) -> None:
    assert gpus_from_config({"DeviceRequests": requests}, env) == gpus
