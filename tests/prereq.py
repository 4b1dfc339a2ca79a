"""Missing prerequisites: a failure under ``CI=true``, a skip with its reason elsewhere."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpuguard.demo.stack.process import ServiceError

_S = TypeVar("_S")

IN_CI = os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> None:
    """Fail under CI, skip elsewhere: a missing prerequisite must never pass silently."""
    if IN_CI:
        pytest.fail(f"prerequisite unavailable under CI: {reason}")
    pytest.skip(reason)


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} not installed (make setup installs it)")
    assert path is not None
    return path


def require_cgroup_freezer() -> None:
    """Skip unless this machine has a cgroup freezer (v1's, or cgroup v2's)."""
    if (
        not Path("/sys/fs/cgroup/freezer").is_dir()
        and not Path("/sys/fs/cgroup/cgroup.controllers").exists()
    ):
        pytest.skip("no cgroup freezer on this machine")


class Services:
    """Services a fixture started: each is started here, and all are stopped by PID later.

    A service that does not come up is ``unavailable`` (a failure under CI, else a skip).
    """

    def __init__(self) -> None:
        self.started: list[Any] = []

    def start(self, service: _S, what: str) -> _S:
        self.started.append(service)
        try:
            service.start()
        except ServiceError as exc:
            unavailable(f"{what} did not start: {exc}")
        return service

    def stop_all(self) -> None:
        for service in reversed(self.started):
            service.stop()
