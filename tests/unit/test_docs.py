"""The documents against the code and against each other: every relative link (and its
anchor) resolves, and the operator reference names every flag, label, metric family,
rule, alert, action and skip reason the code has (issue 19 item 4), so it cannot fall
behind silently. Benchmark scripts are each described in docs/benchmarks.md."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from gpuguard import labels
from gpuguard.cli import build_parser
from gpuguard.commands.run import help_text as run_help
from gpuguard.contract import AlertAction, SkipReason, TriggerSource

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", REPO / "deploy" / "README.md", *sorted(REPO.glob("docs/*.md"))]
REFERENCE = REPO / "docs" / "operator-reference.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text()))


def test_slug_is_githubs() -> None:
    assert slug("Exporter (`gpuguard exporter`)") == "exporter-gpuguard-exporter"
    assert slug("4. Labels on containers") == "4-labels-on-containers"
    assert slug("What NVML's samples can see, and which tasks are judged") == (
        "what-nvmls-samples-can-see-and-which-tasks-are-judged"
    )


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(document: Path) -> None:
    broken = []
    for target in links(document):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _reference() -> str:
    return REFERENCE.read_text()


@pytest.mark.parametrize("command", [c for c in _subparsers() if c not in ("run", "demo")])
def test_the_reference_names_every_flag(command: str) -> None:
    text = _reference()
    flags = [
        name
        for action in _subparsers()[command]._actions
        for name in action.option_strings
        if name.startswith("--") and name != "--help"
    ]
    missing = [f for f in flags if f"`{f}" not in text]
    assert not missing, f"gpuguard {command}: {missing}"


def test_the_reference_names_every_flag_of_run() -> None:
    flags = set(re.findall(r"^ +(--[a-z][a-z.-]*)", run_help(), re.M)) - {"--help"}
    missing = sorted(f for f in flags if f"`{f}" not in _reference())
    assert not missing, missing


def test_the_reference_names_every_container_label() -> None:
    names = [labels.DEADLINE, labels.MANAGED, labels.ROLE, labels.TASK, labels.CLASS,
             *labels.SLO_LABELS, labels.CONTAINER]  # fmt: skip
    missing = [n for n in names if f"`{n}`" not in _reference()]
    assert not missing, missing


def test_the_kubernetes_pod_example_is_valid_and_gives_its_server_alone_an_slo() -> None:
    """docs/kubernetes.md's pod: labels the API server accepts, and the one SLO it promises."""
    from gpuguard import kube, slo
    from tests.support.kubelabels import is_label_key, is_label_value

    text = (REPO / "docs" / "kubernetes.md").read_text()
    documents = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    (pod,) = [d for d in documents if isinstance(d, dict) and d.get("kind") == "Pod"]
    pod_labels = pod["metadata"]["labels"]
    known = {labels.DEADLINE, labels.MANAGED, labels.ROLE, labels.TASK, labels.CLASS,
             *labels.SLO_LABELS, labels.CONTAINER}  # fmt: skip
    for key, value in pod_labels.items():
        assert is_label_key(key) and key in known, key
        assert isinstance(value, str) and is_label_value(value), (key, value)
    sandbox = {**pod_labels, kube.KIND: kube.KIND_SANDBOX, kube.POD_NAME: "chat",
               kube.POD_UID: "u"}  # fmt: skip
    declared = {}
    for container in pod["spec"]["containers"]:
        own = {kube.POD_NAME: "chat", kube.POD_UID: "u", kube.CONTAINER_NAME: container["name"]}
        declaration, errors = slo.declaration(kube.effective_labels(own, sandbox))
        assert errors == ()
        declared[container["name"]] = declaration
    assert [name for name, d in declared.items() if d is not None] == ["vllm"]


def _families() -> set[str]:
    golden = (REPO / "tests" / "fixtures" / "exporter_metrics.prom").read_text()
    found = set(re.findall(r"^# TYPE (\S+) ", golden, re.M))
    sources = ("actuator/metrics.py", "actuator/guard/metrics.py", "placer/service.py")
    for source in (f"gpuguard/{name}" for name in sources):
        found |= set(re.findall(r'"(gpuguard_[a-z_]+)"', (REPO / source).read_text()))
    # prometheus_client's Counter("x") exposes x_total
    counters = {"gpuguard_actuator_actions", "gpuguard_actuator_skipped",
                "gpuguard_actuator_fail_open", "gpuguard_actuator_webhooks",
                "gpuguard_guard_resumed", "gpuguard_placer_requests",
                "gpuguard_actuator_state_write_failures",
                "gpuguard_guard_state_write_failures",
                "gpuguard_actuator_besteffort_control_steps",
                "gpuguard_actuator_slo_queries"}  # fmt: skip
    found -= {"gpuguard_actuator_node_provisionable"} - found  # named in gpuguard/placer/source.py
    return {f"{f}_total" if f in counters else f for f in found}


def test_the_reference_names_every_metric_family() -> None:
    text = _reference()
    missing = sorted(f for f in _families() if not re.search(rf"`{f}[{{`]", text))
    assert not missing, missing


def test_the_reference_names_every_rule_and_alert() -> None:
    text = _reference()
    names = []
    for path in (REPO / "rules").glob("*.rules.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names += [rule.get("alert") or rule["record"] for rule in group["rules"]]
    missing = [n for n in names if f"`{n}`" not in text]
    assert not missing, missing


def test_the_reference_names_every_action_skip_reason_and_trigger() -> None:
    text = _reference()
    values = [*AlertAction, *SkipReason, *TriggerSource]
    missing = [v.value for v in values if f"`{v.value}`" not in text]
    assert not missing, missing


def test_every_benchmark_is_described() -> None:
    text = (REPO / "docs" / "benchmarks.md").read_text()
    scripts = [p.name for p in (REPO / "bench").glob("*.py")]
    missing = [s for s in scripts if not re.search(rf"`(bench/)?{re.escape(s)}`", text)]
    assert not missing, missing


def _rule_severities() -> dict[str, str]:
    found = {}
    for path in (REPO / "rules").glob("*.rules.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    found[rule["alert"]] = rule["labels"]["severity"]
    return found


def test_each_runbook_states_its_alerts_severity() -> None:
    """docs/runbooks.md opens every alert's section with the severity its rule sets (issue
    25: seven said `info` where the rules say `none`, which pages nobody)."""
    text = FENCE.sub("", (REPO / "docs" / "runbooks.md").read_text())
    sections = dict(re.findall(r"^## (\w+)\n\n`(\w+)`", text, re.M))
    severities = _rule_severities()
    assert set(sections) == set(severities), set(sections) ^ set(severities)
    wrong = {name: (said, severities[name]) for name, said in sections.items()
             if said != severities[name]}  # fmt: skip
    assert not wrong, f"runbook says, rule says: {wrong}"
