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
