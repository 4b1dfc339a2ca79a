"""Helpers to read gpuguard's Grafana dashboards and the metric contract they query.

Used by tests/unit/test_dashboards.py (structure, names, promtool) and by the end-to-end
test that runs every panel query against a real Prometheus:

    for uid, title, expr in panel_queries(board):
        result = query(expr)
        if not result and (uid, title) not in MAY_BE_EMPTY: fail(...)

Template variables are replaced by values that select everything (``$node`` -> ``.*``), and
Grafana's interval macros by fixed durations, so each ``expr`` is plain PromQL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_DIR = ROOT / "grafana" / "dashboards"
INTERFACES = ROOT / "docs" / "interfaces.md"

# What each template variable or Grafana macro becomes in a query run outside Grafana.
# Every query variable is multi-valued with "All" = ".*" and used in =~ matchers.
SUBSTITUTIONS = {
    "datasource": "prometheus",
    "node": ".*",
    "gpu": ".*",
    "container": ".*",
    "instance": ".*",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
}

DCGM_NEEDED = "needs dcgm-exporter scraped beside gpuguard (a real GPU); the test stacks run gpusim"

# (dashboard uid, panel title) -> why its query may return nothing in a short end-to-end run.
#
# Assumed run: exporter and actuator scraped, at least one gpuguard.managed container with a
# valid gpuguard.deadline whose GPU tasks start and finish, and each query evaluated as a
# range query over the run (Grafana's time range), not only at its last instant. Under that,
# every panel returns data, because the parts export zeros rather than nothing:
# - gpuguard_container_deadline_hits_total / _misses_total exist (0) for every container
#   from its first poll (gpuguard/exporter/collector.py), so "Deadline misses" is 0, not empty, when
#   no deadline is missed;
# - gpuguard_actuator_fail_open_total has no labels, so it is exported as 0 from start-up;
#   the actuator creates every label value of its other counters and of
#   gpuguard_actuator_decision_seconds at start-up (gpuguard/actuator/metrics.py);
# - gpuguard:gpu_tasks_active:count / gpuguard:gpu_tasks_waiting:count fall back to 0 per GPU
#   (rules/gpuguard-recording.rules.yml), and no panel filters with "> 0" or "== 1".
# Add an entry only for a panel that a correct run can leave empty, with the reason.
MAY_BE_EMPTY: dict[tuple[str, str], str] = {
    ("gpuguard-node", "Container power by SM share"): DCGM_NEEDED,
    ("gpuguard-node", "GPU temperature (dcgm-exporter)"): DCGM_NEEDED,
    ("gpuguard-node", "GPU power (dcgm-exporter)"): DCGM_NEEDED,
    ("gpuguard-node", "Last Xid error (dcgm-exporter)"): DCGM_NEEDED,
    ("gpuguard-tasks", "Latency SLO attainment"): (
        "needs a container that declares an SLO (gpuguard.slo.*) and serves requests; "
        "tests/integration/test_slo_live.py runs this panel's queries with one"
    ),
}

_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


def load_dashboards(directory: Path = DASHBOARD_DIR) -> dict[str, dict[str, Any]]:
    """Dashboard uid -> dashboard, from the committed JSON files."""
    boards: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.json")):
        board = json.loads(path.read_text())
        boards[board["uid"]] = board
    return boards


def substitute(expr: str) -> str:
    """Replace ``$var``, ``${var}`` and ``${var:format}``; an unknown variable raises KeyError."""

    def value(match: re.Match[str]) -> str:
        return SUBSTITUTIONS[match.group(1) or match.group(2)]

    return _VARIABLE.sub(value, expr)


def variables_used(expr: str) -> set[str]:
    """Names of the template variables and macros an expression refers to."""
    return {m.group(1) or m.group(2) for m in _VARIABLE.finditer(expr)}


def iter_panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including panels nested in collapsed rows."""
    for item in board.get("panels", []):
        yield item
        yield from item.get("panels", [])


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL with variables substituted) for every target."""
    return [
        (board["uid"], item["title"], substitute(t["expr"]))
        for item in iter_panels(board)
        for t in item.get("targets", [])
        if not t.get("hide")
    ]


def variable_queries(board: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(dashboard uid, variable name, PromQL selector) for each ``label_values`` variable.

    ``label_values(sel, label)`` lists the values of ``label`` in the series ``sel`` selects;
    the selector itself is the PromQL that must return data for the variable to have values.
    """
    found = []
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", text)
        if match is None:
            raise ValueError(f"{board['uid']} ${variable['name']}: not label_values(): {text}")
        found.append((board["uid"], variable["name"], substitute(match.group(1))))
    return found


# --- the contract (docs/interfaces.md §5, §7, §8) ------------------------------------------


@dataclass(frozen=True)
class ContractMetric:
    name: str
    kind: str  # gauge, counter, histogram, histogram_bucket, ..., or "record"
    labels: frozenset[str]


_CONTRACT_SECTIONS = ("5", "7", "8")


def _expand(names: list[str]) -> list[str]:
    """Expand shorthand like `a_used_bytes` / `_total_bytes` and `a:b:5m` / `:1h`."""
    full: list[str] = []
    for name in names:
        if name.startswith("_") and full:
            parts = name.strip("_").split("_")
            full.append("_".join(full[-1].split("_")[: -len(parts)] + parts))
        elif name.startswith(":") and full:
            full.append(full[-1].rsplit(":", 1)[0] + name)
        else:
            full.append(name)
    return full


def _labels(cell: str) -> frozenset[str]:
    cell = re.sub(r"\([^)]*\)", "", cell)
    return frozenset(part.strip(" `") for part in cell.split(",") if part.strip(" `"))


def contract_metrics(path: Path = INTERFACES) -> dict[str, ContractMetric]:
    """Metric and recording-rule names with their kind and labels, parsed from the doc's tables.

    Histograms also yield their ``_bucket`` (with ``le``), ``_sum`` and ``_count`` series.
    """
    metrics: dict[str, ContractMetric] = {}
    section = ""
    for line in path.read_text().splitlines():
        heading = re.match(r"^##\s+(\d+)\.", line)
        if heading:
            section = heading.group(1)
            continue
        if section not in _CONTRACT_SECTIONS or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`([a-z_:][a-z0-9_:]*)`", cells[0])
        if not names:
            continue
        if section == "7":
            kind, labels = "record", _labels(cells[1])
        else:
            kind, labels = cells[1].split()[0], _labels(cells[2])
        for name in _expand(names):
            metrics[name] = ContractMetric(name, kind, labels)
            if kind == "histogram":
                for suffix, extra in (("_bucket", {"le"}), ("_sum", set()), ("_count", set())):
                    metrics[name + suffix] = ContractMetric(
                        name + suffix, f"histogram{suffix}", labels | extra
                    )
    return metrics


# dcgm-exporter's series the node dashboard joins by UUID, with the labels it gives them
# (its default template: gpu, UUID, pci_bus_id, device, modelName, on MIG GPU_I_PROFILE and
# GPU_I_ID, Hostname; namespace, pod, container with its Kubernetes mapping).
_DCGM_LABELS = frozenset(
    {"gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID",
     "Hostname", "namespace", "pod", "container"}
)  # fmt: skip
DCGM_EXPORTER_METRICS = {
    name: ContractMetric(name, "gauge", _DCGM_LABELS)
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS")
}


# --- PromQL scanning (enough for our dashboards, not a parser) -----------------------------

_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "atan2", "inf", "nan",
}  # fmt: skip
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names(expr: str) -> set[str]:
    """Metric and recording-rule names an expression selects."""
    text = _strip_strings(expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", text):
        if match.group(2) is None and match.group(1).lower() not in _KEYWORDS:
            names.add(match.group(1))
    return names


def selector_labels(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names in its matchers) for every ``name{...}`` selector."""
    found = []
    for match in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", _strip_strings(expr)):
        labels = set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", match.group(2)))
        found.append((match.group(1), labels))
    return found


def grouping_labels(expr: str) -> set[str]:
    """Label names in ``by (...)``, ``without (...)``, ``on (...)`` and friends."""
    labels: set[str] = set()
    for match in _GROUPING.finditer(_strip_strings(expr)):
        labels.update(part.strip() for part in match.group(2).split(",") if part.strip())
    return labels


def range_functions(expr: str) -> list[tuple[str, str]]:
    """(function, metric) for ``rate(metric...)``, ``increase(...)`` and ``irate(...)``."""
    pattern = r"\b(rate|irate|increase)\(\s*([A-Za-z_:][A-Za-z0-9_:]*)"
    return re.findall(pattern, _strip_strings(expr))
