"""The Kubernetes node mark's pure part and how the actuator chooses it (the marker itself
runs against a schema-checking API stand-in: ``tests/integration/test_node_taints.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuguard.actuator.app import node_marker
from gpuguard.actuator.config import load_config
from gpuguard.actuator.engine.containerd import ContainerdEngine
from gpuguard.actuator.engine.docker import DockerEngine
from gpuguard.actuator.engine.swarm import SwarmMarker
from gpuguard.actuator.errors import ConfigError
from gpuguard.actuator.nodemarks.taints import (
    LABEL_KEY,
    TAINT_KEY,
    TaintMarker,
    is_marked,
    with_mark,
)
from gpuguard.ctr import Ctr
from tests.unit.test_actuator_config import base, files, parse

__all__ = ["files"]  # the fixture

OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def node(labels: dict[str, str], taints: list[dict[str, str]]) -> dict[str, object]:
    return {"metadata": {"name": "n", "labels": labels}, "spec": {"taints": taints}}


def test_mark_adds_and_clear_removes_only_gpuguards_own() -> None:
    plain = node({"zone": "a"}, [OTHER])
    marked = with_mark(plain, mark=True)
    assert marked is not None and is_marked(marked) == (True, True)
    assert marked["spec"]["taints"][0] == OTHER  # type: ignore[index]
    assert plain == node({"zone": "a"}, [OTHER])  # the input is left as it was
    cleared = with_mark(marked, mark=False)
    assert cleared == node({"zone": "a"}, [OTHER])
    assert with_mark(marked, mark=True) is None and with_mark(plain, mark=False) is None


def test_half_a_mark_is_completed_or_removed() -> None:
    label_only = node({LABEL_KEY: "true"}, [])
    assert is_marked(label_only) == (False, True)
    assert with_mark(label_only, mark=True) is not None
    taint_only = node({}, [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}])
    cleared = with_mark(taint_only, mark=False)
    assert cleared is not None and "taints" not in cleared["spec"]  # type: ignore[operator]


def test_the_node_marker_flag(files: dict[str, str], tmp_path: Path) -> None:
    config = load_config(parse(base(files)))
    assert config.node_marker == "swarm" and config.kubernetes_api_server is None
    docker_engine = DockerEngine("unix:///nonexistent/docker.sock")
    assert isinstance(node_marker(config, docker_engine), SwarmMarker)
    # containerd has no Swarm: the node list alone (was a Swarm marker that found no swarm)
    assert node_marker(config, ContainerdEngine(Ctr("/nonexistent.sock", "k8s.io"))) is None
    config = load_config(parse([*base(files), "--node.marker=kubernetes",
                                "--kubernetes.api-server=https://10.0.0.1:6443"]))  # fmt: skip
    marker = node_marker(config, docker_engine)
    assert isinstance(marker, TaintMarker) and marker.node_id() == config.node_name
    with pytest.raises(ConfigError, match="node"):
        load_config(parse([*base(files), "--node.marker=taint"]))
