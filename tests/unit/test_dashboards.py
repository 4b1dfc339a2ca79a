"""Grafana dashboards: structure Grafana 10/11 loads (schemaVersion 39), names from the
contract (docs/interfaces.md), expressions that parse (promtool), and committed JSON that
equals what grafana/build.py generates."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.dashboards import (
    DASHBOARD_DIR,
    DCGM_EXPORTER_METRICS,
    MAY_BE_EMPTY,
    ROOT,
    SUBSTITUTIONS,
    contract_metrics,
    grouping_labels,
    iter_panels,
    load_dashboards,
    metric_names,
    panel_queries,
    range_functions,
    selector_labels,
    substitute,
    variable_queries,
    variables_used,
)
from tests.support.scripts import load_script

UIDS = {"gpuguard-node", "gpuguard-tasks", "gpuguard-actuator", "gpuguard-cluster"}
PANEL_TYPES = {"timeseries", "stat", "table", "state-timeline", "bargauge", "row"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}
UNITS = {"percentunit", "bytes", "s", "short", "none", "celsius", "watt"}


def load_build() -> ModuleType:
    return load_script(ROOT / "grafana" / "build.py", "grafana_build")


BOARDS = load_dashboards()
# gpuguard's contract, and dcgm-exporter's series the node dashboard joins by UUID
CONTRACT = contract_metrics() | DCGM_EXPORTER_METRICS
QUERIES = [q for board in BOARDS.values() for q in panel_queries(board)]


def board_ids() -> list[str]:
    return sorted(BOARDS)


# --- generated == committed -----------------------------------------------------------------


def test_committed_json_equals_generated() -> None:
    build = load_build()
    generated = build.build_all()
    committed = {p.name for p in DASHBOARD_DIR.glob("*.json")}
    assert committed == set(generated), "run: python grafana/build.py"
    for name, board in generated.items():
        text = (DASHBOARD_DIR / name).read_text()
        assert text == build.render(board), f"{name} is stale: run python grafana/build.py"


def test_build_check_mode_passes_on_committed_files() -> None:
    assert load_build().main(["--check"]) == 0


def test_the_four_dashboards_exist() -> None:
    assert set(BOARDS) == UIDS
    titles = {uid: board["title"] for uid, board in BOARDS.items()}
    assert titles == {
        "gpuguard-node": "GPU node",
        "gpuguard-tasks": "GPU tasks and deadlines",
        "gpuguard-actuator": "Actuator",
        "gpuguard-cluster": "Cluster",
    }


# --- structure Grafana expects ----------------------------------------------------------------


@pytest.mark.parametrize("uid", board_ids())
def test_dashboard_top_level(uid: str) -> None:
    board = BOARDS[uid]
    assert board["schemaVersion"] == 39
    assert 0 < len(board["uid"]) <= 40  # Grafana's limit
    assert board["title"] and isinstance(board["title"], str)
    assert board.get("id") is None  # provisioning assigns ids
    assert isinstance(board["panels"], list) and board["panels"]
    assert isinstance(board["templating"]["list"], list)
    assert "gpuguard" in board["tags"]
    assert set(board["time"]) == {"from", "to"}


@pytest.mark.parametrize("uid", board_ids())
def test_panels_have_ids_types_and_grid_positions(uid: str) -> None:
    panels = list(iter_panels(BOARDS[uid]))
    ids = [p["id"] for p in panels]
    assert all(isinstance(i, int) for i in ids)
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles)), "titles identify panels in MAY_BE_EMPTY"
    for item in panels:
        assert item["type"] in PANEL_TYPES, item["title"]
        grid = item["gridPos"]
        assert set(grid) >= {"h", "w", "x", "y"}
        assert all(isinstance(grid[k], int) and grid[k] >= 0 for k in "hwxy")
        assert grid["w"] >= 1 and grid["h"] >= 1
        assert grid["x"] + grid["w"] <= 24, f"{item['title']} exceeds 24 columns"


@pytest.mark.parametrize("uid", board_ids())
def test_panels_do_not_overlap(uid: str) -> None:
    boxes = [(p["title"], p["gridPos"]) for p in iter_panels(BOARDS[uid])]
    for i, (title_a, a) in enumerate(boxes):
        for title_b, b in boxes[i + 1 :]:
            apart = (
                a["x"] + a["w"] <= b["x"]
                or b["x"] + b["w"] <= a["x"]
                or a["y"] + a["h"] <= b["y"]
                or b["y"] + b["h"] <= a["y"]
            )
            assert apart, f"{title_a!r} overlaps {title_b!r}"


@pytest.mark.parametrize("uid", board_ids())
def test_targets_have_ref_ids_exprs_and_templated_datasource(uid: str) -> None:
    for item in iter_panels(BOARDS[uid]):
        if item["type"] == "row":
            continue
        assert item["datasource"] == DATASOURCE, item["title"]
        targets = item["targets"]
        assert targets, item["title"]
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), item["title"]
        for t in targets:
            assert re.fullmatch(r"[A-Z]", t["refId"])
            assert isinstance(t["expr"], str) and t["expr"].strip()
            assert t["datasource"] == DATASOURCE, item["title"]
        unit = item["fieldConfig"]["defaults"].get("unit")
        assert unit is None or unit in UNITS, f"{item['title']}: unit {unit}"


@pytest.mark.parametrize("uid", board_ids())
def test_templating(uid: str) -> None:
    variables = BOARDS[uid]["templating"]["list"]
    for variable in variables:
        assert {"name", "type", "query"} <= set(variable), variable
    by_name = {v["name"]: v for v in variables}
    assert len(by_name) == len(variables)
    source = by_name["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    for variable in variables:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            assert text.startswith("label_values("), text
            assert variable["definition"] == text
            # All must mean "match anything": panels use name=~"$var".
            assert variable["includeAll"] and variable["allValue"] == ".*"
    expected = {"datasource", "node", "gpu", "container"}
    if uid == "gpuguard-actuator":
        expected = {"datasource", "instance"}  # actuator metrics carry no node label (§8)
    elif uid == "gpuguard-cluster":
        expected = {"datasource", "node"}
    assert set(by_name) == expected


@pytest.mark.parametrize("uid", board_ids())
def test_every_variable_used_is_defined(uid: str) -> None:
    board = BOARDS[uid]
    defined = {v["name"] for v in board["templating"]["list"]}
    macros = {name for name in SUBSTITUTIONS if name.startswith("__")}
    texts = [t["expr"] for p in iter_panels(board) for t in p.get("targets", [])]
    texts += [json.dumps(v.get("query")) for v in board["templating"]["list"]]
    for text in texts:
        assert variables_used(text) <= defined | macros, text


def test_node_dashboard_filters_by_its_variables() -> None:
    exprs = [t["expr"] for p in iter_panels(BOARDS["gpuguard-node"]) for t in p.get("targets", [])]
    assert all('node=~"$node"' in e for e in exprs if "gpuguard_container_paused" not in e)


# --- names, labels and functions from the contract --------------------------------------------


def test_contract_parse_finds_shorthand_names() -> None:
    for name in (
        "gpuguard_gpu_memory_total_bytes",
        "gpuguard_container_deadline_misses_total",
        "gpuguard_container_paused",
        "gpuguard:container_deadline_hit_ratio:1h",
        "gpuguard:node_min_slack_seconds",
        "gpuguard_actuator_decision_seconds_bucket",
        "gpuguard_actuator_fail_open_total",
    ):
        assert name in CONTRACT, name
    assert CONTRACT["gpuguard_container_gpu_memory_bytes"].labels == {
        "node", "gpu", "namespace", "pod", "container", "container_id", "UUID", "GPU_I_ID",
    }  # fmt: skip
    assert CONTRACT["gpuguard_actuator_actions_total"].labels == {"action", "result"}
    assert CONTRACT["gpuguard_actuator_paused_containers"].labels == frozenset()


@pytest.mark.parametrize(("uid", "title", "expr"), QUERIES)
def test_query_uses_only_contract_names(uid: str, title: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{uid} / {title}: no metric in {expr}"
    unknown = names - set(CONTRACT)
    assert not unknown, f"{uid} / {title}: not in docs/interfaces.md: {sorted(unknown)}"


@pytest.mark.parametrize(("uid", "title", "expr"), QUERIES)
def test_query_labels_exist_on_the_metrics(uid: str, title: str, expr: str) -> None:
    for name, labels in selector_labels(expr):
        allowed = CONTRACT[name].labels | TARGET_LABELS
        assert labels <= allowed, f"{uid} / {title}: {name} has no {sorted(labels - allowed)}"
    known = {label for name in metric_names(expr) for label in CONTRACT[name].labels}
    missing = grouping_labels(expr) - known - TARGET_LABELS
    assert not missing, f"{uid} / {title}: grouping by unknown labels {sorted(missing)}"


@pytest.mark.parametrize(("uid", "title", "expr"), QUERIES)
def test_rate_and_increase_only_on_counters(uid: str, title: str, expr: str) -> None:
    for function, name in range_functions(expr):
        assert CONTRACT[name].kind in ("counter", "histogram_bucket"), (
            f"{uid} / {title}: {function}() of {CONTRACT[name].kind} {name}"
        )


@pytest.mark.parametrize("uid", board_ids())
def test_variable_queries_use_contract_names(uid: str) -> None:
    for _, variable, selector in variable_queries(BOARDS[uid]):
        assert metric_names(selector) <= set(CONTRACT), (variable, selector)


def test_may_be_empty_names_real_panels_with_reasons() -> None:
    panels = {(uid, title) for uid, title, _ in QUERIES}
    for key, reason in MAY_BE_EMPTY.items():
        assert key in panels, f"MAY_BE_EMPTY names no panel: {key}"
        assert len(reason) > 20, key


def test_substitution_leaves_no_variables() -> None:
    for _, _, expr in QUERIES:
        assert "$" not in expr, expr
    assert substitute('x{node=~"${node:regex}"}[$__rate_interval]') == 'x{node=~".*"}[1m]'
    with pytest.raises(KeyError):
        substitute("$nosuchvariable")


# --- every expression parses -------------------------------------------------------------


def all_expressions() -> list[str]:
    exprs = [expr for _, _, expr in QUERIES]
    exprs += [s for board in BOARDS.values() for _, _, s in variable_queries(board)]
    return exprs


def test_expressions_parse_with_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (make setup installs prometheus)")
    rules = {
        "groups": [
            {
                "name": "dashboard_queries",
                "rules": [
                    {"record": f"dashboard_query_{i}", "expr": expr}
                    for i, expr in enumerate(all_expressions())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_queries.rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_expressions_are_balanced() -> None:
    # A cheap check that also runs where promtool is missing.
    pairs = {")": "(", "]": "[", "}": "{"}
    for expr in all_expressions():
        stack: list[str] = []
        for char in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
            if char in "([{":
                stack.append(char)
            elif char in pairs:
                assert stack and stack.pop() == pairs[char], expr
        assert not stack, expr


# --- provisioning ---------------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_datasource_provisioning() -> None:
    config = load_yaml(ROOT / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
    assert config["apiVersion"] == 1
    (source,) = config["datasources"]
    assert source["type"] == "prometheus"
    assert source["access"] == "proxy"
    assert source["isDefault"] is True
    assert re.match(r"^http://(127\.0\.0\.1|localhost):\d+$", source["url"]), source["url"]


def test_dashboard_provisioning_points_at_generated_files() -> None:
    config = load_yaml(ROOT / "grafana" / "provisioning" / "dashboards" / "gpuguard.yaml")
    assert config["apiVersion"] == 1
    (provider,) = config["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    compose = load_yaml(ROOT / "deploy" / "compose.yaml")
    mounts = compose["services"]["grafana"]["volumes"]
    sources = {m.split(":")[1]: m.split(":")[0] for m in mounts}
    assert path in sources, f"{path} is not mounted into the grafana service"
    host = (ROOT / "deploy" / sources[path]).resolve()
    assert host == DASHBOARD_DIR.resolve()


def test_alert_dashboard_links_name_existing_dashboards() -> None:
    rule_files = sorted((ROOT / "rules").glob("*.rules.yml"))
    if not rule_files:
        pytest.skip("rules/*.rules.yml not written yet")
    linked = set()
    for path in rule_files:
        linked.update(re.findall(r"/d/([A-Za-z0-9_-]+)", path.read_text()))
    assert linked <= UIDS, f"alerts link to unknown dashboards: {sorted(linked - UIDS)}"


def test_alert_dashboard_links_use_variables_of_the_linked_dashboard() -> None:
    rule_files = sorted((ROOT / "rules").glob("*.rules.yml"))
    if not rule_files:
        pytest.skip("rules/*.rules.yml not written yet")
    for path in rule_files:
        for uid, query in re.findall(
            r"/d/([A-Za-z0-9_-]+)[^?\s\"']*\?([^\s\"']*)", path.read_text()
        ):
            names = {v["name"] for v in BOARDS[uid]["templating"]["list"]}
            for variable in re.findall(r"var-(\w+)=", query):
                assert variable in names, f"{path.name}: /d/{uid} has no variable {variable}"
