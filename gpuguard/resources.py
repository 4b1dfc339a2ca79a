"""Files gpuguard ships as package data, found the same way in a source tree and when installed.

The design's top-level data folders (``rules/``, ``deploy/``, ``grafana/dashboards/``) are
installed inside the package (``gpuguard/rules`` and so on: ``setup.py``); in a source tree
they are read where they are. Paths are not resolved.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).parent
#: The directory that holds the ``gpuguard`` package (what ``PYTHONPATH`` must name for a
#: process that imports it: the source tree, or site-packages).
IMPORT_ROOT = PACKAGE_DIR.parent


def _shipped(installed: str, in_tree: str) -> Path:
    """A data folder: inside the installed package, else at the source tree's top level."""
    inside = PACKAGE_DIR / installed
    return inside if inside.is_dir() else IMPORT_ROOT / in_tree


RULES_DIR = _shipped("rules", "rules")
ACTIONS_FILE = RULES_DIR / "actions.yml"
RULE_FILES_GLOB = str(RULES_DIR / "*.rules.yml")
DASHBOARDS_DIR = _shipped("dashboards", "grafana/dashboards")
DEPLOY_DIR = _shipped("deploy", "deploy")
PROMETHEUS_DIR = DEPLOY_DIR / "prometheus"
ALERTMANAGER_DIR = DEPLOY_DIR / "alertmanager"
