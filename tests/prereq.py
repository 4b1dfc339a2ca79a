"""Missing prerequisites: a failure under ``CI=true``, a skip with its reason elsewhere."""

from __future__ import annotations

import os
import shutil

import pytest

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
