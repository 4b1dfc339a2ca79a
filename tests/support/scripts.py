"""Import a script that is not in a package (a generator under deploy/ or grafana/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The module at ``path``, executed under ``name`` (default: the file's stem)."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
