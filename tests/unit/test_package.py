"""One installed namespace: ``gpuguard.*`` imports only, a runtime that never needs the
demo/test harness, and the contract names documented in docs/interfaces.md."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuguard import contract, resources

REPO = Path(__file__).resolve().parents[2]
TOP_LEVEL_PARTS = ("exporter", "actuator", "gpusim", "placer")
BARE_IMPORT = re.compile(rf"^\s*(?:from|import) (?:{'|'.join(TOP_LEVEL_PARTS)})\b", re.M)
#: What the deployed programs import; the harness (the folder ``gpuguard/demo/``) is not.
RUNTIME_ENTRY_MODULES = (
    "gpuguard.cli",
    "gpuguard.exporter.app",
    "gpuguard.actuator.app",
    "gpuguard.actuator.guard.program",
    "gpuguard.placer.app",
    "gpuguard.gpusim.daemon",
    "gpuguard.gpusim.workload",
)
HARNESS_MODULES = ("gpuguard.demo", "tests")


def _python_files() -> list[Path]:
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / name for name in tracked]


def test_no_module_imports_a_part_by_its_bare_folder_name() -> None:
    """``import exporter`` would load a second copy of the module beside ``gpuguard.exporter``
    (two ``BackendError`` classes, say) when run from the source tree."""
    offenders = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(REPO)}:{node.lineno} {name}"
                for name in names
                if name.split(".")[0] in TOP_LEVEL_PARTS
            ]
            # code run elsewhere (``python -c`` in a container) imports through gpuguard too
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                offenders += [
                    f"{path.relative_to(REPO)}:{node.lineno} {found.group(0)!r}"
                    for found in BARE_IMPORT.finditer(node.value)
                ]
    assert not offenders, "import through gpuguard.*: " + ", ".join(offenders)


def test_every_file_has_one_path() -> None:
    """The services live in the package; the data folders stay where the design puts them
    and are found there (no link gives a file a second path)."""
    links = [p for p in (REPO / "gpuguard").rglob("*") if p.is_symlink()]
    assert links == []
    for part in TOP_LEVEL_PARTS:
        assert (REPO / "gpuguard" / part / "__init__.py").is_file()
        assert not (REPO / part).exists(), part
    assert resources.RULES_DIR == REPO / "rules"
    assert resources.DASHBOARDS_DIR == REPO / "grafana" / "dashboards"
    assert resources.PROMETHEUS_DIR == REPO / "deploy" / "prometheus"


@pytest.mark.parametrize("module", RUNTIME_ENTRY_MODULES)
def test_runtime_never_imports_the_harness(module: str) -> None:
    # gpuguard.cli imports its commands when it builds its parser, as every command does
    build = f"{module}.build_parser()\n" if module == "gpuguard.cli" else ""
    code = (
        f"import sys, {module}\n{build}"
        f"bad = sorted(m for m in sys.modules if m.startswith({HARNESS_MODULES!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    assert out.stdout.strip() == "", f"{module} pulls in the harness: {out.stdout.strip()}"


def test_package_data_is_where_the_runtime_looks() -> None:
    assert resources.ACTIONS_FILE.is_file()
    assert len(list(resources.RULES_DIR.glob("*.rules.yml"))) >= 2
    assert (resources.PROMETHEUS_DIR / "prometheus.yml").is_file()
    assert (resources.ALERTMANAGER_DIR / "alertmanager.yml").is_file()
    assert len(list(resources.DASHBOARDS_DIR.glob("*.json"))) >= 4


def _documented(section: str) -> str:
    text = (REPO / "docs" / "interfaces.md").read_text()
    match = re.search(rf"^## {section}\. .*?(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/interfaces.md has no section {section}"
    return match.group(0)


@pytest.mark.parametrize(
    ("section", "names"),
    [
        ("1", [k.value for k in contract.WorkloadKind]),
        ("1", [e.value for e in contract.WorkloadEvent]),
        ("3", [p.value for p in contract.RUNNING_PHASES]),
        ("3", [e.value for e in contract.EventType]),
        ("3", [b.value for b in contract.TaskBoundary]),
        ("5", [s.value for s in contract.ActivitySource]),
        ("5", [r.value for r in contract.ProbeReason]),
        ("4", [m.value for m in contract.TaskMode]),
        ("4", [c.value for c in contract.PriorityClass]),
        ("8", [r.value for r in contract.StepReason]),
        ("7", [a.value for a in contract.AlertAction]),
        ("8", [k.value for k in contract.Verb]),
        ("8", [r.value for r in contract.Result]),
        ("8", [s.value for s in contract.SkipReason]),
        ("8", [t.value for t in contract.TriggerSource]),
        ("3", [r.value for r in contract.StateReason]),
        ("9", [r.value for r in contract.RankReason]),
        ("9", [r.value for r in contract.StateReason]),
    ],
)
def test_interfaces_doc_names_every_contract_value(section: str, names: list[str]) -> None:
    text = _documented(section)
    missing = [name for name in names if f"`{name}`" not in text]
    assert not missing, f"docs/interfaces.md section {section} lacks {missing}"
