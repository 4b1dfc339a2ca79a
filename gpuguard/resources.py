"""Files gpuguard ships as package data, found the same way in a source tree and when installed.

The top-level folders of the design (``rules/``, ``deploy/``, ``grafana/dashboards/``) are
linked into the package (``gpuguard/rules`` and so on), so an installed gpuguard carries the
rules and actions the actuator validates against, the dashboards, and the Prometheus and
Alertmanager configs the demo starts with. Paths are not resolved: inside the package they
stay under it, whichever way it was installed.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).parent
#: The directory that holds the ``gpuguard`` package (what ``PYTHONPATH`` must name for a
#: process that imports it: the source tree, or site-packages).
IMPORT_ROOT = PACKAGE_DIR.parent

RULES_DIR = PACKAGE_DIR / "rules"
ACTIONS_FILE = RULES_DIR / "actions.yml"
RULE_FILES_GLOB = str(RULES_DIR / "*.rules.yml")
DASHBOARDS_DIR = PACKAGE_DIR / "dashboards"
PROMETHEUS_DIR = PACKAGE_DIR / "deploy" / "prometheus"
ALERTMANAGER_DIR = PACKAGE_DIR / "deploy" / "alertmanager"
