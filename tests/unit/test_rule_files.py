"""The rule files against the contract (docs/interfaces.md sections 5 and 7): alert and
record names, labels and annotations every alert must carry, metric names used."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
INTERFACES = REPO / "docs" / "interfaces.md"
RULE_FILES = sorted((REPO / "rules").glob("*.rules.yml"))
DASHBOARD_UIDS = {"gpuguard-node", "gpuguard-tasks", "gpuguard-actuator", "gpuguard-cluster"}
SEVERITIES = {"critical", "warning", "none"}
REQUIRED_ANNOTATIONS = {"summary", "description", "runbook", "runbook_url", "dashboard"}
# Triggers for the actuator, not pages (rules/gpuguard-alerts.rules.yml, header).
CONTROLLER_ALERTS = {
    "GpuguardGpuSaturatedContention",
    "GpuguardGpuMemoryPressure",
    "GpuguardGpuIdleWhileTasksWait",
    "GpuguardTaskDeadlineOverrun",
    "GpuguardTaskDeadlineAtRisk",
    "GpuguardNodeInStateZero",
    "GpuguardSloAtRisk",
}
GRAFANA = "{{ with $externalLabels.grafana_url }}{{ . }}{{ else }}http://127.0.0.1:3000{{ end }}"
RUNBOOKS = (
    "{{ with $externalLabels.runbook_url }}{{ . }}"
    "{{ else }}http://127.0.0.1:9090/user/runbooks.md{{ end }}"
)


def section(number: int) -> str:
    """The text of ``## <number>.`` up to the next ``## `` heading."""
    text = INTERFACES.read_text()
    match = re.search(rf"^## {number}\. .*?(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/interfaces.md has no section {number}"
    return match.group(0)


def expand(names: str) -> list[str]:
    """``a_b_c` / `_d_e``-style table cells: a shorthand replaces as many trailing
    ``_``/``:``-separated parts of the first name as it has."""
    items = re.findall(r"`([^`]+)`", names)
    if not items:
        return []
    first, result = items[0], [items[0]]
    for item in items[1:]:
        if item[0] in "_:":
            sep = item[0]
            parts = item[1:].split(sep)
            result.append(sep.join(first.split(sep)[: -len(parts)]) + item)
        else:
            result.append(item)
    return result


def contract_alerts() -> set[str]:
    text = section(7)
    alerts = text.split("Alerts (", 1)[1].split("`rules/actions.yml`", 1)[0]
    return set(re.findall(r"`([A-Z][A-Za-z]+)`", alerts))


def contract_records() -> set[str]:
    records: set[str] = set()
    for line in section(7).splitlines():
        if line.startswith("| `gpuguard:"):
            records.update(expand(line.split("|")[1]))
    return records


def contract_metrics() -> set[str]:
    """The exporter's metrics (section 5) and the actuator's (section 8)."""
    metrics: set[str] = set()
    for line in (section(5) + section(8)).splitlines():
        if line.startswith("| `gpuguard_"):
            metrics.update(expand(line.split("|")[1]))
    return metrics


def rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


ALERTS = [rule for rule in rules() if "alert" in rule]


def test_contract_parses() -> None:
    assert len(contract_alerts()) == 16
    assert "gpuguard:container_deadline_hit_ratio:1h" in contract_records()
    assert "gpuguard_gpu_memory_total_bytes" in contract_metrics()
    assert "gpuguard_container_deadline_misses_total" in contract_metrics()


def test_alert_names_equal_the_contract() -> None:
    names = [rule["alert"] for rule in ALERTS]
    assert len(names) == len(set(names)), "duplicate alert names"
    assert set(names) == contract_alerts()


def test_record_names_equal_the_contract() -> None:
    names = [rule["record"] for rule in rules() if "record" in rule]
    assert len(names) == len(set(names)), "duplicate records"
    assert set(names) == contract_records()


@pytest.mark.parametrize("rule", ALERTS, ids=lambda rule: rule["alert"])
def test_alert_has_severity_and_annotations(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    missing = REQUIRED_ANNOTATIONS - set(annotations)
    assert not missing, f"missing annotations {sorted(missing)}"
    assert all(str(annotations[key]).strip() for key in REQUIRED_ANNOTATIONS)
    # Absolute links: the Grafana of the external label grafana_url, else compose's.
    dashboard = re.match(re.escape(GRAFANA) + r"/d/([a-z-]+)/", annotations["dashboard"])
    assert dashboard and dashboard.group(1) in DASHBOARD_UIDS, annotations["dashboard"]
    anchor = "#" + rule["alert"].lower()
    assert annotations["runbook_url"] == RUNBOOKS + anchor
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    assert f"\n## {rule['alert']}\n" in runbooks, f"docs/runbooks.md has no {rule['alert']}"
    # `none`: no default inhibit rule of kube-prometheus-stack targets it
    # (docs/operator-reference.md).
    expected = {"none"} if rule["alert"] in CONTROLLER_ALERTS else {"warning", "critical"}
    assert rule["labels"]["severity"] in expected
    # A trigger's `for:` stays short (it drives a control loop); a page waits a minute, so
    # one failed scrape or a restart pages nobody.
    if rule["labels"]["severity"] == "critical":
        assert rule.get("for") in {"1m", "2m", "5m"}, rule["alert"]
    else:
        assert rule.get("for", "0s") in {"0s", "1s", "2s", "3s", "5s", "10s", "1m"}


@pytest.mark.parametrize("rule", ALERTS, ids=lambda rule: rule["alert"])
def test_alert_carries_its_action(rule: dict[str, Any]) -> None:
    """Alertmanager routes to the actuator on ``gpuguard_action``: it must say what
    rules/actions.yml says."""
    actions = yaml.safe_load((REPO / "rules" / "actions.yml").read_text())["actions"]
    assert rule["labels"].get("gpuguard_action") == actions.get(rule["alert"])


@pytest.mark.parametrize("rule", ALERTS, ids=lambda rule: rule["alert"])
def test_alert_annotations_use_only_labels_it_keeps(rule: dict[str, Any]) -> None:
    """An annotation naming a label the expression aggregates away would render empty."""
    expr = rule["expr"]
    kept = re.findall(r"\bby \(([^)]*)\)", expr)
    if not kept or re.search(r"\bup\{", expr):
        return  # no aggregation: the series' own labels all survive
    outer = {label.strip() for label in kept[-1].split(",")}
    used = set()
    for text in rule["annotations"].values():
        used |= set(re.findall(r"\$labels\.(\w+)", str(text)))
    assert used <= outer, f"annotations use {sorted(used - outer)} which the expression drops"


def test_rules_use_only_contract_metrics() -> None:
    known = contract_metrics()
    for rule in rules():
        used = set(re.findall(r"\bgpuguard_[a-z_]+", rule["expr"]))
        assert used <= known, f"{rule.get('alert') or rule['record']} uses {sorted(used - known)}"
