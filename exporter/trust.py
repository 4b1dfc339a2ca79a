"""The operator's trust policy: which classes and deadlines a container may claim by label.

A tenant who can start a container sets its own ``gpuguard.*`` labels. Without a policy the
exporter believes them (every container may claim ``real-time`` and any deadline). With
``--trust.policy-file`` the operator says, per image, container name or Kubernetes namespace,
what a container may claim; a claim beyond that is rejected, counted
(``gpuguard_container_claim_rejected``) and shown in ``/api/v1/state``
(``claims_rejected``):

    version: 1
    default:                      # containers no rule matches
      classes: [normal, best-effort]
      min_deadline: 1s
    rules:                        # the first rule that matches decides
      - match: {namespace: "inference-*"}
        classes: [real-time, normal, best-effort]
        min_deadline: 20ms
      - match: {image: "registry.example.com/batch/*", name: "train-*"}
        classes: [best-effort]

A rule matches when every key it gives matches (``fnmatch`` patterns; ``namespace`` is the
``io.kubernetes.pod.namespace`` label that Kubernetes' container runtimes set, which a
tenant's own ``docker run`` could also set, so match namespaces only where Docker is not
reachable by tenants). A rejected class becomes the first allowed of ``normal``,
``best-effort`` (in that order); a deadline below the minimum is raised to it, so the task is
still judged but cannot jump an EDF queue. Parsing is pure and strict: a bad file is one
ConfigError line at start-up.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuguard import flags, labels, loader
from gpuguard.contract import PriorityClass
from gpuguard.exporter.errors import ConfigError
from gpuguard.exporter.model import ContainerInfo

#: Docker label that Kubernetes' container runtimes (cri-dockerd) set to the pod's namespace.
NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
_MATCH_KEYS = ("image", "name", "namespace")
_RULE_KEYS = {"match", "classes", "min_deadline"}
_FALLBACK = (PriorityClass.NORMAL, PriorityClass.BEST_EFFORT)
_MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Grant:
    """What a matching container may claim."""

    classes: frozenset[PriorityClass] = frozenset(PriorityClass)
    min_deadline_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TrustRule:
    match: tuple[tuple[str, str], ...]  # (key, fnmatch pattern), every one must match
    grant: Grant

    def matches(self, subject: Mapping[str, str]) -> bool:
        return all(fnmatch.fnmatchcase(subject.get(k, ""), p) for k, p in self.match)


@dataclass(frozen=True, slots=True)
class TrustPolicy:
    rules: tuple[TrustRule, ...] = ()
    default: Grant = Grant()

    def grant(self, subject: Mapping[str, str]) -> Grant:
        """The grant of the first rule that matches ``subject``, else the default."""
        return next((r.grant for r in self.rules if r.matches(subject)), self.default)


#: No policy file: every claim is believed (gpuguard's behaviour before trust policies).
TRUST_ALL = TrustPolicy()


def subject(info: ContainerInfo, container_labels: Mapping[str, Any]) -> dict[str, str]:
    """What rules match on: the container's image, name and Kubernetes namespace."""
    return {
        "image": info.image,
        "name": info.name,
        "namespace": str(container_labels.get(NAMESPACE_LABEL) or ""),
    }


def apply(grant: Grant, info: ContainerInfo) -> ContainerInfo:
    """``info`` with the claims ``grant`` does not allow replaced, each rejection kept in
    ``claims_rejected`` as (label, why). Pure."""
    rejected: list[tuple[str, str]] = []
    deadline = info.deadline_s
    if deadline is not None and deadline < grant.min_deadline_s:
        rejected.append(
            (
                labels.DEADLINE,
                f"{deadline:g}s is below the {grant.min_deadline_s:g}s this container may "
                "claim: raised to it",
            )
        )
        deadline = grant.min_deadline_s
    claimed = replace(info, deadline_s=deadline).priority_class
    class_label = info.class_label
    if claimed not in grant.classes:
        allowed = next((c for c in _FALLBACK if c in grant.classes), PriorityClass.BEST_EFFORT)
        rejected.append(
            (labels.CLASS, f"{claimed} is not allowed for this container: treated as {allowed}")
        )
        class_label = allowed
    if not rejected:
        return info
    return replace(
        info,
        deadline_s=deadline,
        class_label=class_label,
        claims_rejected=info.claims_rejected + tuple(rejected),
    )


@flags.reraise_as(ConfigError)
def load_policy(path: Path) -> TrustPolicy:
    """The policy in ``path``; ConfigError (one line) when it cannot be used. The file is read
    by the one loader (size, depth, encoding and integer limits: ``gpuguard/loader.py``)."""
    doc = loader.read_yaml(path, "--trust.policy-file", _MAX_FILE_BYTES)
    try:
        return parse_policy(doc)
    except ValueError as exc:
        raise ConfigError(f"--trust.policy-file {path}: {exc}") from exc


def parse_policy(doc: Any) -> TrustPolicy:
    """A policy document (``load_policy``'s format) as a TrustPolicy; ValueError says why not."""
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise ValueError("expected a mapping with version: 1")
    unknown = set(doc) - {"version", "default", "rules"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    default = _grant({} if doc.get("default") is None else doc["default"], "default")
    rules_doc = [] if doc.get("rules") is None else doc["rules"]
    if not isinstance(rules_doc, list):
        raise ValueError("rules: expected a list")
    return TrustPolicy(tuple(_rule(r, i) for i, r in enumerate(rules_doc)), default)


def _rule(doc: Any, index: int) -> TrustRule:
    where = f"rules[{index}]"
    if not isinstance(doc, dict) or not set(doc) <= _RULE_KEYS:
        raise ValueError(f"{where}: expected keys among {sorted(_RULE_KEYS)}")
    match = doc.get("match")
    if not isinstance(match, dict) or not match or not set(match) <= set(_MATCH_KEYS):
        raise ValueError(f"{where}.match: expected one or more of {list(_MATCH_KEYS)}")
    if not all(isinstance(v, str) and v for v in match.values()):
        raise ValueError(f"{where}.match: patterns must be non-empty strings")
    pairs = tuple((k, str(match[k])) for k in _MATCH_KEYS if k in match)
    grant = _grant({k: v for k, v in doc.items() if k != "match"}, where)
    return TrustRule(pairs, grant)


def _grant(doc: Any, where: str) -> Grant:
    if not isinstance(doc, dict) or not set(doc) <= {"classes", "min_deadline"}:
        raise ValueError(f"{where}: expected classes and/or min_deadline")
    classes = frozenset(PriorityClass)
    if "classes" in doc:
        names = doc["classes"]
        if not isinstance(names, list) or not names:
            raise ValueError(f"{where}.classes: expected a non-empty list")
        try:
            classes = frozenset(PriorityClass(str(n)) for n in names)
        except ValueError as exc:
            choices = ", ".join(PriorityClass)
            raise ValueError(f"{where}.classes: {exc} (choices: {choices})") from exc
    minimum = 0.0
    if "min_deadline" in doc:
        try:
            minimum = labels.parse_duration(str(doc["min_deadline"]))
        except labels.LabelError as exc:
            raise ValueError(f"{where}.min_deadline: {exc}") from exc
    if not math.isfinite(minimum):
        raise ValueError(f"{where}.min_deadline: must be finite")
    return Grant(classes, minimum)
