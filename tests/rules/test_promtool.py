"""promtool on gpuguard's rules: ``check rules`` (syntax, lint) and ``test rules`` (the unit
tests in this directory: each alert firing and not firing, recording rule values).

Without promtool: fail under ``CI=true``, skip elsewhere with the reason.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.prereq import require_binary

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((REPO / "rules").glob("*.rules.yml"))
TEST_FILES = sorted(Path(__file__).parent.glob("*_test.yml"))


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_binary("promtool")


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_rule_files_exist() -> None:
    names = {path.name for path in RULE_FILES}
    assert {"gpuguard-recording.rules.yml", "gpuguard-alerts.rules.yml"} <= names


def test_check_rules(promtool: str) -> None:
    result = run([promtool, "check", "rules", *map(str, RULE_FILES)], REPO)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda path: path.name)
def test_rule_unit_tests(promtool: str, test_file: Path) -> None:
    result = run([promtool, "test", "rules", test_file.name], test_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_promtool_test() -> None:
    import yaml

    alerts = {
        rule["alert"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert alerts - fired == set(), "alerts never tested firing"
    assert alerts - quiet == set(), "alerts never tested not firing"


def test_kubernetes_alerts_name_the_pod(promtool: str, tmp_path: Path) -> None:
    """deploy/kubernetes/prometheusrule.yaml's alerts: `namespace` is gpuguard's, which the
    AlertmanagerConfig's route needs (it overwrites the tenant's: a templated copy of it is
    no option, as Prometheus 2.42 keeps a template that expands to nothing as its text); a
    per-container alert keeps the tenant's `pod` and `container`."""
    import yaml

    document = yaml.safe_load((REPO / "deploy/kubernetes/prometheusrule.yaml").read_text())
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": document["spec"]["groups"]}))
    pod = 'node="a",gpu="0",namespace="team-a",pod="web-0",container="infer",container_id="id1"'
    overrun = (
        'alertname="GpuguardTaskDeadlineOverrun",alertstate="firing",severity="none",'
        f'gpuguard_action="record",{pod},namespace="gpuguard"'
    ).replace('namespace="team-a",', "", 1)
    state_zero = (
        'alertname="GpuguardNodeInStateZero",alertstate="firing",severity="none",'
        'gpuguard_action="mark_node",node="a",namespace="gpuguard"'
    )
    case = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": [
                    {"series": f"gpuguard_container_task_slack_seconds{{{pod}}}", "values": "-1x5"},
                    {
                        "series": f'gpuguard_container_task_boundary{{{pod},boundary="exact"}}',
                        "values": "1x5",
                    },
                    {"series": 'gpuguard_node_state{node="a"}', "values": "0x90"},
                ],
                # ALERTS: the labels alone (alert_rule_test compares annotations too)
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertname="GpuguardTaskDeadlineOverrun"}',
                        "eval_time": "1s",
                        "exp_samples": [{"labels": f"ALERTS{{{overrun}}}", "value": 1}],
                    },
                    {
                        "expr": 'ALERTS{alertname="GpuguardNodeInStateZero"}',
                        "eval_time": "80s",
                        "exp_samples": [{"labels": f"ALERTS{{{state_zero}}}", "value": 1}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "k8s_test.yml").write_text(yaml.safe_dump(case))
    result = run([promtool, "test", "rules", "k8s_test.yml"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
