"""The operator's trust policy: what a container may claim by label, and who is managed.

A tenant who can start a container sets its own ``gpuguard.*`` labels. The exporter believes
of them only what the policy in force grants; the actuator, the metrics, the node record and
the placer then all see the granted claim, never the raw label. Three policies can be in
force (``--trust.*`` flags; the exporter logs which at start-up and exports it as
``gpuguard_exporter_trust_policy_info``):

- the **built-in default** (no flag), for a host several tenants share: ``DEFAULT_DOC``;
- a **policy file** (``--trust.policy-file``), rules per image, container name or
  Kubernetes namespace, the first that matches deciding (``deploy/trust-policy.example.yml``)::

      version: 1
      default:                      # containers no rule matches (left out: the built-in one)
        classes: [normal, best-effort]
        min_deadline: 1s
      rules:
        - match: {namespace: "inference-*"}
          managed: true
          classes: [real-time, normal, best-effort]
          min_deadline: 20ms

- **trust-all** (``--trust.all``, or the one-line file ``{version: 1, default: {}}``): every
  claim believed, for single-tenant hosts and the demo.

A grant restricts only what it names: ``classes`` (a class not listed becomes the first
allowed of ``normal``, ``best-effort``), ``min_deadline`` (a shorter deadline is raised to
it, so it cannot jump an EDF queue), ``real_time_needs_deadline`` (real-time only with a
``gpuguard.deadline``, never by ``gpuguard.class`` alone), ``slo: false`` (the tenant's own
latency histogram is not believed: no SLO pressure on its neighbours, no SLO alerts),
``misses_mark_node: false`` (its misses are its own: they never count toward the node record
or its node-marking alerts) and ``managed`` (``true``: managed whatever ``gpuguard.managed``
or ``gpuguard.role`` say; ``false``: never paused; left out: the tenant's label decides).
Whatever the grant, a container whose deadline or class claim was not granted as given never
counts toward the node (``deadline_vouched``).

A rule matches when every key it gives matches (``fnmatch`` patterns). ``namespace`` is the
pod's namespace as the Kubernetes CRI's sandbox records it (containerd source); a Docker
container's own ``io.kubernetes.pod.namespace`` label is never believed, since whoever runs
``docker run`` can set it. Parsing and applying are pure; a bad file is one ConfigError line
at start-up.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuguard import flags, labels, loader, units
from gpuguard.contract import COMPONENT_ROLES, PriorityClass, Role
from gpuguard.exporter.errors import ConfigError
from gpuguard.exporter.model import ContainerInfo

_MATCH_KEYS = ("image", "name", "namespace")
_BOOL_KEYS = ("real_time_needs_deadline", "slo", "misses_mark_node")
_GRANT_KEYS = {"classes", "min_deadline", "managed", "roles", *_BOOL_KEYS}
#: The policy file format's versions this exporter reads.
VERSIONS = (1,)
_RULE_KEYS = {"match", *_GRANT_KEYS}
_FALLBACK = (PriorityClass.NORMAL, PriorityClass.BEST_EFFORT)
_MAX_FILE_BYTES = 1 << 20

#: Which policy is in force (``gpuguard_exporter_trust_policy_info{policy}``).
DEFAULT, FILE, TRUSTING = "default", "file", "trust-all"


@dataclass(frozen=True, slots=True)
class Grant:
    """What a matching container may claim; each field left at its default restricts nothing."""

    classes: frozenset[PriorityClass] = frozenset(PriorityClass)
    min_deadline_s: float = 0.0
    real_time_needs_deadline: bool = False
    slo: bool = True
    misses_mark_node: bool = True
    #: True: managed whatever its labels say; False: never paused; None: its label decides
    managed: bool | None = None
    #: the ``gpuguard.role`` values believed of a managed container (each never paused)
    roles: frozenset[Role] = frozenset(Role)


@dataclass(frozen=True, slots=True)
class TrustRule:
    match: tuple[tuple[str, str], ...]  # (key, fnmatch pattern), every one must match
    grant: Grant

    def matches(self, subject: Mapping[str, str]) -> bool:
        """Every pattern matches; a key the subject lacks (a namespace off Kubernetes)
        matches no pattern, ``*`` included."""
        return all(k in subject and fnmatch.fnmatchcase(subject[k], p) for k, p in self.match)


@dataclass(frozen=True, slots=True)
class TrustPolicy:
    rules: tuple[TrustRule, ...] = ()
    default: Grant = Grant()
    #: which policy this is: DEFAULT, FILE or TRUSTING
    kind: str = FILE
    #: the file it was read from (FILE only)
    path: str = ""

    def grant(self, subject: Mapping[str, str]) -> Grant:
        """The grant of the first rule that matches ``subject``, else the default."""
        return next((r.grant for r in self.rules if r.matches(subject)), self.default)

    def describe(self) -> str:
        """One line for the start-up log: which policy, and what it grants tenants at large."""
        if self.kind == TRUSTING:
            source = f" ({self.path})" if self.path else ""
            return (
                f"trust-all{source}: every claim made by label is believed "
                "(a single-tenant host only)"
            )
        where = "built-in default" if self.kind == DEFAULT else self.path
        return f"{where} ({len(self.rules)} rules; tenants at large: {_summary(self.default)})"


def _summary(grant: Grant) -> str:
    if grant == Grant():
        return "every claim believed"
    classes = ", ".join(c for c in PriorityClass if c in grant.classes)
    parts = [f"classes {classes}"]
    if PriorityClass.REAL_TIME in grant.classes and grant.real_time_needs_deadline:
        parts.append("real-time only with a deadline")
    if grant.min_deadline_s:
        parts.append(f"deadlines under {labels.format_duration(grant.min_deadline_s)} raised")
    if not grant.slo:
        parts.append("no SLO pressure")
    if not grant.misses_mark_node:
        parts.append("misses never mark the node")
    if grant.managed is not None:
        parts.append("all managed" if grant.managed else "none managed")
    if grant.managed is None and grant.roles != frozenset(Role):
        believed = ", ".join(r for r in Role if r in grant.roles) or "none"
        parts.append(f"{labels.ROLE} believed: {believed}")
    return ", ".join(parts)


#: Every claim believed: ``--trust.all`` (single-tenant hosts, the demo).
TRUST_ALL = TrustPolicy(kind=TRUSTING)

#: The built-in default, for a host several tenants share (docs/security.md says why each).
DEFAULT_DOC = """\
version: 1
default:
  # real-time (which goes first and freezes best-effort neighbours) is the operator's to
  # grant, by a rule in a policy file: a tenant at large is at most normal
  classes: [normal, best-effort]
  # a deadline orders an EDF queue: none under 1s, so no task due within 1s is jumped
  min_deadline: 1s
  # a tenant's own latency histogram is no evidence for freezing or paging anyone
  slo: false
  # nor are its own misses: they never take the node out of placement
  misses_mark_node: false
  # gpuguard.role (never paused) is for gpuguard's own containers, which an operator starts:
  # a managed tenant's own role is not believed, so it ranks as any managed tenant
  roles: []
"""


def subject(info: ContainerInfo, namespace: str | None = None) -> dict[str, str]:
    """What rules match on: the container's image and name, and the namespace of its pod as
    the CRI's sandbox records it (absent off Kubernetes: never read from the container's own
    labels, and matched by no ``namespace`` pattern)."""
    found = {"image": info.image, "name": info.name}
    if namespace:
        found["namespace"] = namespace
    return found


def enforce(
    policy: TrustPolicy, info: ContainerInfo, namespace: str | None = None
) -> ContainerInfo:
    """``info`` as ``policy`` allows it (``apply`` with the grant of its first matching rule)."""
    if policy.kind == TRUSTING:
        return info
    return apply(policy.grant(subject(info, namespace)), info)


def apply(grant: Grant, info: ContainerInfo) -> ContainerInfo:
    """``info`` with the claims ``grant`` does not allow replaced, each rejection kept in
    ``claims_rejected`` as (label, why). Pure."""
    rejected: list[tuple[str, str]] = []
    deadline = info.deadline_s
    if deadline is not None and deadline < grant.min_deadline_s:
        floor = labels.format_duration(grant.min_deadline_s)
        rejected.append(
            (
                labels.DEADLINE,
                f"{deadline:g}s is below the {floor} this container may claim: raised to it",
            )
        )
        deadline = grant.min_deadline_s
    claimed = replace(info, deadline_s=deadline).priority_class
    class_label = info.class_label
    allowed = next((c for c in _FALLBACK if c in grant.classes), PriorityClass.BEST_EFFORT)
    if claimed not in grant.classes:
        implied = f" (implied by {labels.DEADLINE})" if info.class_label is None else ""
        why = f"{claimed}{implied} is not granted to this container: treated as {allowed}"
        rejected.append((labels.CLASS, why))
        class_label = allowed
    elif claimed == PriorityClass.REAL_TIME and deadline is None and grant.real_time_needs_deadline:
        rejected.append(
            (labels.CLASS, f"real-time needs a {labels.DEADLINE} here: treated as {allowed}")
        )
        class_label = allowed
    slo = info.slo
    if slo is not None and not grant.slo:
        rejected.append(
            (labels.SLO_METRIC, "this container's SLO is not believed here: not published")
        )
        slo = None
    managed, role = info.managed, info.role
    if grant.managed is not None:
        managed = grant.managed
    if managed and role in COMPONENT_ROLES:
        if grant.managed:
            why = f"{role} is not believed: the policy manages this container"
        elif role not in grant.roles:
            why = f"{role} is not granted to this container: treated as any managed tenant"
        else:
            why = ""
        if why:
            rejected.append((labels.ROLE, why))
            role = None
    vouched = info.deadline_vouched
    if deadline is not None:  # without one there is nothing to vouch for
        as_given = not any(label in (labels.DEADLINE, labels.CLASS) for label, _ in rejected)
        vouched = vouched and grant.misses_mark_node and as_given
    if not rejected and (managed, vouched) == (info.managed, info.deadline_vouched):
        return info
    return replace(
        info,
        deadline_s=deadline,
        class_label=class_label,
        slo=slo,
        managed=managed,
        role=role,
        deadline_vouched=vouched,
        claims_rejected=info.claims_rejected + tuple(rejected),
    )


@flags.reraise_as(ConfigError)
def load_policy(path: Path) -> TrustPolicy:
    """The policy in ``path`` (kind FILE, or TRUSTING where it restricts nothing); ConfigError
    (one line) when it cannot be used. The file is read by the one loader (size, depth,
    encoding, duplicate-key and integer limits: ``gpuguard/loader.py``)."""
    doc = loader.read_yaml(path, "--trust.policy-file", _MAX_FILE_BYTES)
    try:
        return replace(parse_policy(doc), path=str(path))
    except ValueError as exc:
        raise ConfigError(f"--trust.policy-file {path}: {exc}") from exc


def parse_policy(doc: Any) -> TrustPolicy:
    """A policy document (``load_policy``'s format) as a TrustPolicy; ValueError says why not.

    ``default`` left out (or empty of value) is the built-in default's grant; ``default: {}``
    restricts nothing, and with no rules the document is trust-all (kind TRUSTING)."""
    if not isinstance(doc, dict):
        raise ValueError("expected a mapping with version: 1")
    version = doc.get("version")
    # bool is an int in Python and 1.0 == 1: only the integer itself names a version
    if type(version) is not int or version not in VERSIONS:
        shown = "missing" if version is None else repr(version)[:20]
        raise ValueError(f"version: {shown} is not one this exporter reads (write version: 1)")
    unknown = set(doc) - {"version", "default", "rules"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    given = doc.get("default")
    default = DEFAULT_POLICY.default if given is None else _grant(given, "default")
    rules_doc = [] if doc.get("rules") is None else doc["rules"]
    if not isinstance(rules_doc, list):
        raise ValueError("rules: expected a list")
    rules = tuple(_rule(r, i) for i, r in enumerate(rules_doc))
    if not rules and default == Grant():
        return TRUST_ALL  # a file that restricts nothing is trust-all, and says so
    return TrustPolicy(rules, default)


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
    if not isinstance(doc, dict) or not set(doc) <= _GRANT_KEYS:
        raise ValueError(f"{where}: expected keys among {sorted(_GRANT_KEYS)}")
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
        if not isinstance(doc["min_deadline"], str):
            raise ValueError(f"{where}.min_deadline: write a duration with its unit, e.g. 1s")
        try:
            minimum = units.parse_duration(doc["min_deadline"])
        except units.UnitError as exc:
            raise ValueError(f"{where}.min_deadline: {exc}") from exc
    roles = frozenset(Role)
    if "roles" in doc:
        names = doc["roles"]
        if not isinstance(names, list):
            raise ValueError(f"{where}.roles: expected a list (empty: none believed)")
        try:
            roles = frozenset(Role(str(n)) for n in names)
        except ValueError as exc:
            choices = ", ".join(Role)
            raise ValueError(f"{where}.roles: {exc} (choices: {choices})") from exc
    for key in ("managed", *_BOOL_KEYS):
        if key in doc and not isinstance(doc[key], bool):
            raise ValueError(f"{where}.{key}: expected true or false")
    return Grant(
        classes,
        minimum,
        real_time_needs_deadline=doc.get("real_time_needs_deadline", False),
        slo=doc.get("slo", True),
        misses_mark_node=doc.get("misses_mark_node", True),
        managed=doc.get("managed"),
        roles=roles,
    )


#: The built-in default as a policy (``DEFAULT_DOC``): what ``--trust.*`` left out means.
DEFAULT_POLICY = replace(
    parse_policy(loader.parse_yaml(DEFAULT_DOC, "the built-in trust policy")), kind=DEFAULT
)
