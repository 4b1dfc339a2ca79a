"""The operator's trust policy (exporter/trust.py): parsing, one table test per branch of
``apply``, and the policy applied where the exporter builds a container from ``inspect``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.contract import PriorityClass, Role
from gpuguard.exporter import trust
from gpuguard.exporter.config import add_flags, load_config
from gpuguard.exporter.containers import container_info
from gpuguard.exporter.errors import ConfigError
from gpuguard.exporter.model import ContainerInfo
from gpuguard.exporter.state import _container_json
from gpuguard.exporter.trust import Grant, TrustPolicy, apply, parse_policy
from gpuguard.slo import SloDeclaration

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


SLO = SloDeclaration("vllm:e2e_request_latency_seconds", 0.5)


@pytest.mark.parametrize(
    ("grant", "given", "expected", "rejected"),
    [
        # real-time by class alone, where real-time needs a deadline: the first fallback
        (
            Grant(real_time_needs_deadline=True),
            {"class_label": RT},
            {"priority_class": NORMAL},
            ("gpuguard.class",),
        ),
        # ... with a deadline it stays real-time
        (
            Grant(real_time_needs_deadline=True),
            {"class_label": RT, "deadline_s": 2.0},
            {"priority_class": RT, "deadline_vouched": True},
            (),
        ),
        # an SLO not believed is not published (no SLO alert, no pressure on neighbours)
        (Grant(slo=False), {"slo": SLO}, {"slo": None}, ("gpuguard.slo.metric",)),
        # managed by the policy whatever the labels: gpuguard.role=exporter is not believed
        (
            Grant(managed=True),
            {"managed": False, "role": "exporter"},
            {"managed": True, "role": None},
            ("gpuguard.role",),
        ),
        # ... a tenant that only leaves out gpuguard.managed is managed, nothing to reject
        (Grant(managed=True), {}, {"managed": True}, ()),
        # never paused where the policy says so; a tenant's own role stands where it is not
        (Grant(managed=False), {"managed": True}, {"managed": False}, ()),
        (Grant(), {"role": "exporter"}, {"role": "exporter", "managed": False}, ()),
        # misses kept the tenant's own: the claim stands, the node never hears of it
        (
            Grant(misses_mark_node=False),
            {"deadline_s": 9.0},
            {"priority_class": RT, "deadline_vouched": False},
            (),
        ),
        # a claim not granted as given never counts toward the node, whatever the grant says
        (
            Grant(min_deadline_s=1.0),
            {"deadline_s": 1e-13},
            {"deadline_s": 1.0, "deadline_vouched": False},
            ("gpuguard.deadline",),
        ),
        (
            Grant(frozenset({NORMAL, BE})),
            {"deadline_s": 9.0},
            {"priority_class": NORMAL, "deadline_vouched": False},
            ("gpuguard.class",),
        ),
    ],
)
def test_apply_bounds(
    grant: Grant, given: dict[str, Any], expected: dict[str, Any], rejected: tuple[str, ...]
) -> None:
    result = apply(grant, info(**given))
    assert {key: getattr(result, key) for key in expected} == expected
    assert tuple(label for label, _ in result.claims_rejected) == rejected


def test_an_implied_class_says_where_it_came_from() -> None:
    (rejection,) = apply(Grant(frozenset({NORMAL, BE})), info(deadline_s=9.0)).claims_rejected
    assert rejection == (
        "gpuguard.class",
        "real-time (implied by gpuguard.deadline) is not granted to this container: "
        "treated as normal",
    )


def test_the_built_in_default() -> None:
    """What a host several tenants share gets without a flag (docs/security.md says why)."""
    default = trust.DEFAULT_POLICY
    assert (default.kind, default.rules) == (trust.DEFAULT, ())
    assert default.default == Grant(
        frozenset({NORMAL, BE}), 1.0, slo=False, misses_mark_node=False, roles=frozenset()
    )
    # what the hostile tenant tried, each bounded
    hostile = trust.enforce(default, info(class_label=RT, deadline_s=1e-13, slo=SLO, managed=True))
    assert (hostile.priority_class, hostile.deadline_s, hostile.slo) == (NORMAL, 1.0, None)
    assert not hostile.deadline_vouched
    # an honest tenant without claims is left as it is
    assert trust.enforce(default, info(managed=True)) == info(managed=True)
    assert default.describe() == (
        "built-in default (0 rules; tenants at large: classes normal, best-effort, deadlines "
        "under 1s raised, no SLO pressure, misses never mark the node, gpuguard.role "
        "believed: none)"
    )
    assert "single-tenant" in trust.TRUST_ALL.describe()


@pytest.mark.parametrize("role", ["exporter", "actuator", "guard"])
def test_the_built_in_default_believes_no_tenants_role(role: str) -> None:
    """A managed tenant's own gpuguard.role would make it never paused while its tasks hold
    the GPU; under the built-in default it is paused like any managed tenant."""
    claim = trust.enforce(trust.DEFAULT_POLICY, info(managed=True, role=role))
    assert (claim.managed, claim.role) == (True, None)
    assert [label for label, _ in claim.claims_rejected] == ["gpuguard.role"]
    # unmanaged, the role changes nothing (never paused either way): nothing to reject, so
    # gpuguard's own containers show no rejected claim
    own = info(role=role)
    assert trust.enforce(trust.DEFAULT_POLICY, own) == own


def test_a_policy_grants_roles_by_rule() -> None:
    policy = parse_policy(
        yaml.safe_load(
            "version: 1\nrules:\n  - match: {image: 'registry.example.com/gpuguard:*'}\n"
            "    roles: [exporter, actuator, guard]\n"
        )
    )
    own = info(managed=True, role="exporter")
    assert trust.enforce(policy, replace(own, image="registry.example.com/gpuguard:1")) == replace(
        own, image="registry.example.com/gpuguard:1"
    )
    # elsewhere the file's default is the built-in one: not believed
    assert trust.enforce(policy, own).role is None
    # a grant that leaves roles out restricts nothing, as every key
    assert Grant().roles == frozenset(Role)
    with pytest.raises(ValueError, match=r"default\.roles: 'tenant' is not a valid Role"):
        parse_policy({"version": 1, "default": {"roles": ["tenant"]}})
    with pytest.raises(ValueError, match=r"default\.roles: expected a list"):
        parse_policy({"version": 1, "default": {"roles": "exporter"}})


def test_a_namespace_pattern_matches_only_a_container_with_a_namespace() -> None:
    """``namespace: '*'`` means "any Kubernetes pod": a plain Docker container has no
    namespace, so the rule is not its own (it gets the default)."""
    policy = parse_policy(
        yaml.safe_load(
            "version: 1\nrules:\n  - match: {namespace: '*'}\n    classes: [real-time]\n"
        )
    )
    claim = {"gpuguard.deadline": "0.0000000001ms", "gpuguard.managed": "true"}
    docker = container_info(inspect_doc(claim), policy)
    assert (docker.priority_class, docker.deadline_s) == (NORMAL, 1.0)
    assert not docker.deadline_vouched
    pod = trust.enforce(policy, info(deadline_s=1e-13), namespace="team-a")
    assert (pod.priority_class, pod.deadline_s) == (RT, 1e-13)
    # nor does an empty namespace match: it is no namespace
    assert trust.enforce(policy, info(deadline_s=1e-13), namespace="").priority_class == NORMAL
    # image and name are always there: '*' on them matches every container
    every = parse_policy({"version": 1, "rules": [{"match": {"name": "*"}, "classes": ["normal"]}]})
    assert every.grant(trust.subject(info())) == Grant(frozenset({NORMAL}))


def test_a_file_that_restricts_nothing_is_trust_all_and_says_so(tmp_path: Path) -> None:
    """The documented one-line trust-all file is reported as trust-all (with its file), not
    as a "file" policy that looks like a restrictive one."""
    import argparse

    parser = argparse.ArgumentParser()
    add_flags(parser)
    path = tmp_path / "trust.yml"
    for text in ("{version: 1, default: {}}", "version: 1\ndefault: {slo: true}\nrules: []\n"):
        path.write_text(text)
        policy = load_config(parser.parse_args([f"--trust.policy-file={path}"]), env={}).trust
        assert (policy.kind, policy.path) == (trust.TRUSTING, str(path))
        assert policy.describe() == (
            f"trust-all ({path}): every claim made by label is believed (a single-tenant host only)"
        )
        claim = info(class_label=RT, deadline_s=1e-13, slo=SLO, role="exporter", managed=True)
        assert trust.enforce(policy, claim) == claim
    # rules and an empty default: a file policy, whose line says what tenants at large get
    path.write_text("version: 1\ndefault: {}\nrules: [{match: {name: x}, classes: [normal]}]\n")
    policy = load_config(parser.parse_args([f"--trust.policy-file={path}"]), env={}).trust
    assert policy.kind == trust.FILE
    assert policy.describe() == f"{path} (1 rules; tenants at large: every claim believed)"


def test_a_file_without_default_gets_the_built_in_one_and_an_empty_default_trusts_all() -> None:
    rules_only = parse_policy({"version": 1, "rules": [{"match": {"name": "x"}}]})
    assert rules_only.default == trust.DEFAULT_POLICY.default
    one_line = parse_policy(yaml.safe_load("{version: 1, default: {}}"))
    assert one_line.default == Grant() and one_line.rules == ()
    assert one_line.kind == trust.TRUSTING
    claim = info(class_label=RT, deadline_s=1e-13, slo=SLO, role="exporter")
    assert trust.enforce(one_line, claim) == claim


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
        ("version: 1\ndefault: {managed: maybe}", "default.managed: expected true or false"),
        ("version: 1\ndefault: {slo: 1}", "default.slo: expected true or false"),
        ("version: 1\ndefault: {misses_mark_node: []}", "default.misses_mark_node"),
        (
            "version: 1\nrules: [{match: {name: x}, real_time_needs_deadline: yes please}]",
            "rules[0].real_time_needs_deadline",
        ),
        ("version: 1\ndefault: {pause: never}", "default: expected keys among"),
        # only the integer version: YAML's true and 1.0 compare equal to 1 in Python
        ("version: true", "version: True is not one this exporter reads"),
        ("version: 1.0", "version: 1.0 is not one this exporter reads"),
        ("version: '1'", "version: '1' is not one this exporter reads"),
        ("default: {}", "version: missing is not one this exporter reads"),
        # durations have one spelling, with their unit
        ("version: 1\ndefault: {min_deadline: 1}", "default.min_deadline: write a duration"),
        ("version: 1\ndefault: {min_deadline: '1'}", "default.min_deadline: invalid duration"),
        ("version: 1\ndefault: {min_deadline: 9 s}", "default.min_deadline: invalid duration"),
        ("version: 1\ndefault: {min_deadline: .5s}", "default.min_deadline: invalid duration"),
    ],
)
def test_bad_policies_say_why(doc: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_policy(yaml.safe_load(doc))


def inspect_doc(labels: dict[str, str], name: str = "/web", image: str = "nginx") -> Any:
    return {"Id": "d" * 64, "Name": name, "Config": {"Image": image, "Labels": labels}}


def test_container_info_applies_the_policy_but_never_a_docker_namespace_label() -> None:
    policy = parse_policy(yaml.safe_load(POLICY_DOC))
    claim = {"gpuguard.class": "real-time", "gpuguard.deadline": "0.0000000001ms"}
    tenant = container_info(inspect_doc(claim), policy)
    assert tenant.priority_class == NORMAL and tenant.deadline_s == 1.0
    assert [label for label, _ in tenant.claims_rejected] == ["gpuguard.deadline", "gpuguard.class"]
    # whoever runs `docker run` sets io.kubernetes.pod.namespace: it matches no rule
    spoofed = container_info(
        inspect_doc({**claim, "io.kubernetes.pod.namespace": "inference-a"}), policy
    )
    assert spoofed.priority_class == NORMAL and spoofed.deadline_s == 1.0
    # without a policy every claim is believed, as before
    assert container_info(inspect_doc(claim)).priority_class == RT


def test_rejections_are_in_the_state_json() -> None:
    rejected = apply(Grant(frozenset({BE})), info(class_label=RT))

    class Snap:
        default_task_mode = "burst"
        demand: dict[str, float] = {}
        typical_run: dict[str, float] = {}
        longest_run: dict[str, float] = {}

    doc = _container_json(rejected, Snap())  # type: ignore[arg-type]
    assert doc["class"] == BE
    assert [item["label"] for item in doc["claims_rejected"]] == ["gpuguard.class"]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        # the issue's: the second classes granted real-time
        ("version: 1\nrules:\n  - match: {name: x}\n    classes: [normal]\n"
         "    classes: [real-time]\n", "classes"),
        # and a second default: {} turned the file into trust-all
        ("version: 1\ndefault: {classes: [normal]}\ndefault: {}\n", "default"),
        ("version: 1\nversion: 1\n", "version"),
        ("version: 1\nrules: [{match: {name: x, name: y}}]\n", "name"),
    ],
)  # fmt: skip
def test_a_key_given_twice_is_refused(text: str, key: str, tmp_path: Path) -> None:
    path = tmp_path / "trust.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        trust.load_policy(path)
    assert str(err.value).startswith(f"--trust.policy-file {path}: invalid YAML: the key {key!r}")
    assert "\n" not in str(err.value)


def test_the_policy_file_is_loaded_once_at_start_up(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_flags(parser)
    path = tmp_path / "trust.yml"
    path.write_text(POLICY_DOC)
    config = load_config(parser.parse_args([f"--trust.policy-file={path}"]), env={})
    assert isinstance(config.trust, TrustPolicy) and len(config.trust.rules) == 2
    assert (config.trust.kind, config.trust.path) == (trust.FILE, str(path))
    # no flag: the built-in default; --trust.all: no policy at all
    assert load_config(parser.parse_args([]), env={}).trust is trust.DEFAULT_POLICY
    assert load_config(parser.parse_args(["--trust.all"]), env={}).trust is trust.TRUST_ALL
    both = parser.parse_args(["--trust.all", f"--trust.policy-file={path}"])
    with pytest.raises(ConfigError, match="exclude each other"):
        load_config(both, env={})
    path.write_text("version: 1\ndefault: {classes: [gold]}")
    with pytest.raises(ConfigError, match=r"trust\.policy-file"):
        load_config(parser.parse_args([f"--trust.policy-file={path}"]), env={})
    with pytest.raises(ConfigError, match=r"trust\.policy-file"):
        load_config(parser.parse_args([f"--trust.policy-file={tmp_path / 'none'}"]), env={})


def test_trust_all_from_a_config_file_must_be_a_boolean(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_flags(parser)
    config_file = tmp_path / "exporter.yml"
    config_file.write_text("trust.all: true\n")
    args = parser.parse_args([f"--config.file={config_file}"])
    assert load_config(args, env={}).trust is trust.TRUST_ALL
    config_file.write_text("trust.all: sometimes\n")
    with pytest.raises(ConfigError, match=r"--trust\.all: must be true or false"):
        load_config(args, env={})


def test_the_shipped_example_policy_loads() -> None:
    """The example an operator copies is the safe one: tenants at large get what the built-in
    default gives them, all managed; real-time by rule only."""
    example = Path(__file__).resolve().parents[2] / "deploy" / "trust-policy.example.yml"
    policy = trust.load_policy(example)
    at_large = {"image": "gpuguard/workload:local", "name": "rt-1"}
    assert policy.grant(at_large) == Grant(
        frozenset({NORMAL, BE}), 1.0, slo=False, misses_mark_node=False, managed=True
    )
    # a tenant that states a deadline of 1 s or more is judged against it, but not real-time
    stated = trust.enforce(policy, info(deadline_s=9.0, managed=True))
    assert (stated.priority_class, stated.deadline_s) == (NORMAL, 9.0)
    assert not stated.deadline_vouched
    # an inference namespace gets real-time, and its misses count
    served = trust.enforce(policy, info(deadline_s=0.05), namespace="inference-eu")
    assert (served.priority_class, served.deadline_vouched) == (RT, True)
    # real-time by class alone at large: normal
    assert trust.enforce(policy, info(class_label=RT)).priority_class == NORMAL


def test_the_examples_permissive_choice_is_a_commented_one() -> None:
    """The permissive grant is in the example, commented out, and does what its comment says
    once chosen: a deadline of 1 s or more buys real-time."""
    example = Path(__file__).resolve().parents[2] / "deploy" / "trust-policy.example.yml"
    text = example.read_text()
    chosen = text.replace("  classes: [normal, best-effort]\n", "").replace(
        "  # classes: [real-time, normal, best-effort]\n  # real_time_needs_deadline: true\n",
        "  classes: [real-time, normal, best-effort]\n  real_time_needs_deadline: true\n",
    )
    assert chosen != text
    policy = parse_policy(yaml.safe_load(chosen))
    stated = trust.enforce(policy, info(deadline_s=9.0, managed=True))
    assert (stated.priority_class, stated.claims_rejected) == (RT, ())


def test_security_md_shows_the_built_in_default_as_the_code_has_it() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert f"```yaml\n{trust.DEFAULT_DOC}```" in doc
