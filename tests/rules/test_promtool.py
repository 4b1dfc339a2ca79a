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
