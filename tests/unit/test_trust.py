"""The operator's trust policy (exporter/trust.py): parsing, one table test per branch of
``apply``, and the policy applied where the exporter builds a container from ``inspect``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.contract import PriorityClass
from gpuguard.exporter import trust
from gpuguard.exporter.config import add_flags, load_config
from gpuguard.exporter.containers import container_info
from gpuguard.exporter.errors import ConfigError
from gpuguard.exporter.model import ContainerInfo
from gpuguard.exporter.state import _container_json
from gpuguard.exporter.trust import Grant, TrustPolicy, apply, parse_policy

RT, NORMAL, BE = PriorityClass.REAL_TIME, PriorityClass.NORMAL, PriorityClass.BEST_EFFORT
POLICY_DOC = """
version: 1
default:
  classes: [normal, best-effort]
  min_deadline: 1s
rules:
  - match: {namespace: "inference-*"}
    classes: [real-time, normal, best-effort]
    min_deadline: 20ms
  - match: {image: "registry.example.com/batch/*", name: "train-*"}
    classes: [best-effort]
"""


def info(**kwargs: Any) -> ContainerInfo:
    return ContainerInfo(id="c" * 64, name="web", image="nginx", state="running", **kwargs)


@pytest.mark.parametrize(
    ("grant", "given", "deadline", "klass", "rejected"),
    [
        # believed: a grant that allows the claim changes nothing
        (Grant(), {"deadline_s": 1e-12}, 1e-12, RT, ()),
        # an implicit real-time claim (a deadline, no class) where real-time is not allowed
        (Grant(frozenset({NORMAL, BE})), {"deadline_s": 2.0}, 2.0, NORMAL, ("gpuguard.class",)),
        # an explicit class not allowed, and normal not allowed either: best-effort
        (Grant(frozenset({BE})), {"class_label": RT}, None, BE, ("gpuguard.class",)),
        # a deadline under the minimum is raised to it, the class stays
        (Grant(min_deadline_s=0.02), {"deadline_s": 1e-13}, 0.02, RT, ("gpuguard.deadline",)),
        # both at once
        (
            Grant(frozenset({NORMAL}), 1.0),
            {"deadline_s": 0.001, "class_label": RT},
            1.0,
            NORMAL,
            ("gpuguard.deadline", "gpuguard.class"),
        ),
        # no claim at all: normal, allowed by default grants
        (Grant(frozenset({NORMAL, BE}), 1.0), {}, None, NORMAL, ()),
    ],
)
def test_apply(
    grant: Grant,
    given: dict[str, Any],
    deadline: float | None,
    klass: PriorityClass,
    rejected: tuple[str, ...],
) -> None:
    result = apply(grant, info(**given))
    assert result.deadline_s == deadline
    assert result.priority_class == klass
    assert tuple(label for label, _ in result.claims_rejected) == rejected


def test_first_matching_rule_decides_else_the_default() -> None:
    policy = parse_policy(yaml.safe_load(POLICY_DOC))
    assert policy.grant({"namespace": "inference-prod", "image": "x", "name": "y"}) == Grant(
        frozenset(PriorityClass), 0.02
    )
    batch = {"image": "registry.example.com/batch/sim:1", "name": "train-7", "namespace": ""}
    assert policy.grant(batch).classes == frozenset({BE})
    # every key of a rule must match: the image alone is not enough
    assert policy.grant({**batch, "name": "eval-7"}) == policy.default
    assert policy.default == Grant(frozenset({NORMAL, BE}), 1.0)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("[]", "version: 1"),
        ("version: 2", "version: 1"),
        ("version: 1\nextra: 1", "unknown keys"),
        ("version: 1\nrules: {}", "rules: expected a list"),
        ("version: 1\nrules: [{classes: [normal]}]", "rules[0].match"),
        ("version: 1\nrules: [{match: {pod: x}}]", "rules[0].match"),
        ("version: 1\nrules: [{match: {name: x}, classes: [gold]}]", "rules[0].classes"),
        ("version: 1\ndefault: {min_deadline: soon}", "default.min_deadline"),
        ("version: 1\ndefault: {classes: []}", "default.classes"),
    ],
)
def test_bad_policies_say_why(doc: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_policy(yaml.safe_load(doc))


def inspect_doc(labels: dict[str, str], name: str = "/web", image: str = "nginx") -> Any:
    return {"Id": "d" * 64, "Name": name, "Config": {"Image": image, "Labels": labels}}


def test_container_info_applies_the_policy_by_namespace() -> None:
    policy = parse_policy(yaml.safe_load(POLICY_DOC))
    claim = {"gpuguard.class": "real-time", "gpuguard.deadline": "0.0000000001ms"}
    tenant = container_info(inspect_doc(claim), policy)
    assert tenant.priority_class == NORMAL and tenant.deadline_s == 1.0
    assert [label for label, _ in tenant.claims_rejected] == ["gpuguard.deadline", "gpuguard.class"]
    served = container_info(
        inspect_doc({**claim, trust.NAMESPACE_LABEL: "inference-a", "gpuguard.deadline": "50ms"}),
        policy,
    )
    assert served.priority_class == RT and served.claims_rejected == ()
    # without a policy every claim is believed, as before
    assert container_info(inspect_doc(claim)).priority_class == RT


def test_rejections_are_in_the_state_json() -> None:
    rejected = apply(Grant(frozenset({BE})), info(class_label=RT))

    class Snap:
        default_task_mode = "burst"
        demand: dict[str, float] = {}
        typical_run: dict[str, float] = {}

    doc = _container_json(rejected, Snap())  # type: ignore[arg-type]
    assert doc["class"] == BE
    assert [item["label"] for item in doc["claims_rejected"]] == ["gpuguard.class"]


def test_the_policy_file_is_loaded_once_at_start_up(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_flags(parser)
    path = tmp_path / "trust.yml"
    path.write_text(POLICY_DOC)
    config = load_config(parser.parse_args([f"--trust.policy-file={path}"]), env={})
    assert isinstance(config.trust, TrustPolicy) and len(config.trust.rules) == 2
    assert load_config(parser.parse_args([]), env={}).trust is trust.TRUST_ALL
    path.write_text("version: 1\ndefault: {classes: [gold]}")
    with pytest.raises(ConfigError, match=r"trust\.policy-file"):
        load_config(parser.parse_args([f"--trust.policy-file={path}"]), env={})
    with pytest.raises(ConfigError, match=r"trust\.policy-file"):
        load_config(parser.parse_args([f"--trust.policy-file={tmp_path / 'none'}"]), env={})


def test_the_shipped_example_policy_loads() -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "trust-policy.example.yml"
    policy = trust.load_policy(example)
    assert policy.default.classes == frozenset({NORMAL, BE})
    assert (
        policy.grant({"namespace": "inference-eu", "image": "", "name": ""}).min_deadline_s == 0.02
    )
