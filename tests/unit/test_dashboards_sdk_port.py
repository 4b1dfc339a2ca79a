"""The dashboards grafana/build.py makes with grafana-foundation-sdk keep everything the
hand-written generator (grafana/build_legacy.py) put in them: every panel, query, unit,
threshold, mapping, override, link and variable. The SDK may add fields (Grafana's own
defaults); it may drop only empty defaults, listed below with the reason."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Values the old JSON spelled out that Grafana assumes when a field is absent: an empty
# `custom`, `current`, `options` or `timepicker`, and a null dashboard `id` (provisioning
# assigns ids). The SDK omits a field it was not given.
EMPTY_DEFAULTS = ({}, [], None)
# The SDK's datasource variable has no `refresh` (Grafana lists data sources on load).
DROPPED = {("templating", "list", "datasource", "refresh")}


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"grafana_{name}", ROOT / "grafana" / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lost(old: Any, new: Any, path: tuple[str, ...]) -> Iterator[str]:
    """Paths of the values in ``old`` that ``new`` lacks or changes."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            yield f"{'/'.join(path)}: {old!r} -> {new!r}"
            return
        for key, value in old.items():
            if key in new:
                yield from lost(value, new[key], (*path, key))
            elif value not in EMPTY_DEFAULTS and (*path[-3:], key) not in DROPPED:
                yield f"{'/'.join((*path, key))}: {value!r} missing"
    elif isinstance(old, list):
        if not isinstance(new, list) or len(old) != len(new):
            yield f"{'/'.join(path)}: {old!r} -> {new!r}"
            return
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            name = a.get("title", a.get("name", index)) if isinstance(a, dict) else index
            yield from lost(a, b, (*path, str(name)))
    elif old != new or type(old) is not type(new):
        yield f"{'/'.join(path)}: {old!r} -> {new!r}"


OLD = load("build_legacy.py").build_all()
NEW = load("build.py").build_all()


def test_same_dashboards() -> None:
    assert set(OLD) == set(NEW)


@pytest.mark.parametrize("name", sorted(OLD))
def test_sdk_dashboard_keeps_everything_the_old_one_had(name: str) -> None:
    # Panels are compared in order, so titles, ids, grid positions and targets line up.
    losses = list(lost(OLD[name], NEW[name], (name,)))
    assert not losses, "\n".join(losses)


def test_comparison_sees_a_lost_query() -> None:
    board = NEW["gpuguard-node.json"]
    changed = {**board, "panels": [dict(board["panels"][0], targets=[])]}
    assert list(lost(OLD["gpuguard-node.json"], changed, ("node",)))
