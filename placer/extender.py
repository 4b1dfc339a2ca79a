"""kube-scheduler's HTTP extender (``k8s.io/kube-scheduler/extender/v1``) over the placer.

Another adapter beside ``http.py``'s query API, over the same ranking (``Placer.ranking``,
``ranking.rank``): nothing here ranks. kube-scheduler POSTs ``ExtenderArgs`` as JSON to
``<urlPrefix>/<verb>`` for every pod that requests a resource in the extender's
``managedResources`` (``nvidia.com/gpu``):

- ``filter`` answers ``ExtenderFilterResult``: the nodes where the pod's declared deadline
  can be met (the ranking's eligible candidates), every other one in
  ``FailedAndUnresolvableNodes`` with a one-line message that ``kubectl describe pod``
  shows; ``FailedNodes`` is always empty: kube-scheduler's preemption judges a node by its
  own filters alone, which these nodes already passed (docs/kubernetes.md);
- ``prioritize`` answers ``HostPriorityList``: the ranking's order of the eligible nodes as
  scores from ``MAX_EXTENDER_PRIORITY`` (10, the best) down to 1, every other node 0.

The types have no JSON tags in Go, so their fields are spelt as in Go (``Pod``,
``NodeNames``, ``FailedNodes``, ``Host``, ``Score``) and Go's decoder matches them in any
case: so does ``parse_args``. ``NodeNames`` comes when the extender is configured
``nodeCacheCapable: true`` (the placer's node cache is Prometheus' records), else ``Nodes``
(whole ``v1.Node`` objects, echoed back as they came); a result answers in the same field.

A pod declares itself with pod labels or annotations: ``gpuguard.deadline`` (without it the
pod is not real-time: every node passes and scores 0), ``gpuguard.memory`` (a byte size:
Kubernetes quantities such as ``20Gi``) and ``gpuguard.runtime`` (optional); durations as
container labels write them, Go's forms included (``1m30s``: ``gpuguard/units.py``). A
declaration that cannot be read fails every node, unresolvable, with the reason, which
kube-scheduler's ``FitError`` puts in the pod's ``FailedScheduling`` event.
Nothing is reserved: kube-scheduler never says which node it chose (docs/kubernetes.md).
Prometheus unreachable is a 503, which kube-scheduler takes as the extender failing: with
``ignorable: true`` it schedules without gpuguard (fail open), counted here as
``gpuguard_placer_requests_total{endpoint="extender_filter",code="503"}``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuguard import labels
from gpuguard.placer.errors import BadRequest, RecordsUnavailable
from gpuguard.placer.query import parse_duration, parse_memory
from gpuguard.placer.ranking import Candidate, Ranking, Request
from gpuguard.placer.service import Placer

log = logging.getLogger(__name__)

#: ``extenderv1.MaxExtenderPriority`` / ``MinExtenderPriority``: kube-scheduler multiplies a
#: score by the extender's weight and by MaxNodeScore / 10.
MAX_EXTENDER_PRIORITY = 10
MIN_EXTENDER_PRIORITY = 0
#: Where the verbs are served: the ``urlPrefix`` of the KubeSchedulerConfiguration ends with
#: this path, and kube-scheduler appends ``/`` and the verb.
PATH_PREFIX = "/api/v1/extender"
FILTER_VERB = "filter"
PRIORITIZE_VERB = "prioritize"
#: A request body larger than this is a 413 (kube-scheduler then skips the extender). With
#: ``nodeCacheCapable: true`` a body is the pod and the node names: 4 MiB holds a pod at
#: etcd's 1.5 MiB object limit and tens of thousands of names; whole ``v1.Node`` objects
#: (``nodeCacheCapable: false``, 10-30 KB each with their image lists) fit for a few hundred.
MAX_BODY = 4 * 1024 * 1024
#: A node name is a DNS subdomain (RFC 1123), as the API server validates it.
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_NODE_NAME = 253
_ARGS_FIELDS = {"pod": "Pod", "nodes": "Nodes", "nodenames": "NodeNames"}
NO_RECORD = "gpuguard: no record of this node (no gpuguard exporter there, or not scraped)"


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """What kube-scheduler sent: the pod's identity and declaration, and the candidates."""

    pod: str  # namespace/name, for the log
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    node_names: tuple[str, ...]
    #: the ``Nodes.items`` objects as sent (nodeCacheCapable false); None with NodeNames
    node_items: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node for one pod: passes, or fails with a message."""

    eligible: bool
    #: the node's best place in the ranking; None where nothing was ranked (a pod that
    #: declares no deadline, or whose declaration cannot be read)
    position: int | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    code: int
    doc: Any


class DeclarationError(ValueError):
    """A pod's gpuguard labels or annotations cannot be read; one line."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_args(body: bytes) -> ExtenderArgs:
    """``ExtenderArgs`` from a request body (pure); BadRequest with one line when it is not
    what kube-scheduler sends."""
    try:
        doc = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise BadRequest("body is not UTF-8") from None
    except RecursionError:
        raise BadRequest("body is not ExtenderArgs: nested too deep") from None
    except ValueError as exc:
        raise BadRequest(f"body is not JSON: {str(exc)[:80]}") from None
    if not isinstance(doc, dict):
        raise BadRequest("body is not ExtenderArgs: a JSON object with Pod and NodeNames or Nodes")
    fields: dict[str, Any] = {}
    for key, value in doc.items():
        name = _ARGS_FIELDS.get(key.lower())
        if name is None:
            continue  # Go's decoder ignores unknown fields
        if name in fields:
            raise BadRequest(f"{name} given twice")
        fields[name] = value
    pod = fields.get("Pod")
    if not isinstance(pod, dict):
        raise BadRequest("Pod: must be a v1.Pod object")
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        raise BadRequest("Pod.metadata: must be an object")
    name, namespace = meta.get("name"), meta.get("namespace", "")
    if not isinstance(name, str) or not name or not isinstance(namespace, str):
        raise BadRequest("Pod.metadata: name and namespace must be strings")
    nodes, node_names = fields.get("Nodes"), fields.get("NodeNames")
    if (nodes is None) == (node_names is None):
        raise BadRequest(
            "exactly one of Nodes and NodeNames must be given "
            "(kube-scheduler sends NodeNames when the extender is nodeCacheCapable)"
        )
    items = _node_items(nodes) if nodes is not None else None
    names = (
        tuple(_node_name(item.get("metadata", {}).get("name"), "Nodes.items") for item in items)
        if items is not None
        else _names(node_names)
    )
    return ExtenderArgs(
        pod=f"{namespace}/{name}",
        labels=_string_map(meta.get("labels"), "Pod.metadata.labels"),
        annotations=_string_map(meta.get("annotations"), "Pod.metadata.annotations"),
        node_names=names,
        node_items=items,
    )


def _node_items(nodes: Any) -> tuple[Mapping[str, Any], ...]:
    items = nodes.get("items") if isinstance(nodes, dict) else None
    if not isinstance(items, list) or not all(
        isinstance(item, dict) and isinstance(item.get("metadata"), dict) for item in items
    ):
        raise BadRequest("Nodes: must be a v1.NodeList (items, each with metadata)")
    return tuple(items)


def _names(node_names: Any) -> tuple[str, ...]:
    if not isinstance(node_names, list):
        raise BadRequest("NodeNames: must be a list of node names")
    return tuple(_node_name(name, "NodeNames") for name in node_names)


def _node_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or len(name) > MAX_NODE_NAME or not _NODE_NAME.fullmatch(name):
        shown = repr(name)[:70] if isinstance(name, str) else type(name).__name__
        raise BadRequest(f"{where}: {shown} is not a node name")
    return name


def _string_map(value: Any, where: str) -> Mapping[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise BadRequest(f"{where}: must map strings to strings")
    return value


def declared_request(args: ExtenderArgs) -> Request | None:
    """The placement request a pod declares, or None when it declares no deadline (not
    real-time); DeclarationError when a value cannot be read or label and annotation differ."""
    deadline = _declared(args, labels.DEADLINE)
    if deadline is None:
        return None
    memory = _declared(args, labels.PLACEMENT_MEMORY)
    runtime = _declared(args, labels.PLACEMENT_RUNTIME)
    try:
        return Request(
            deadline_s=parse_duration(labels.DEADLINE, deadline),
            memory_bytes=(
                parse_memory(memory, labels.PLACEMENT_MEMORY) if memory is not None else 0
            ),
            runtime_s=(
                parse_duration(labels.PLACEMENT_RUNTIME, runtime) if runtime is not None else None
            ),
        )
    except BadRequest as exc:
        raise DeclarationError(str(exc)) from None


def _declared(args: ExtenderArgs, key: str) -> str | None:
    on_label, on_annotation = args.labels.get(key), args.annotations.get(key)
    if on_label is not None and on_annotation is not None and on_label != on_annotation:
        raise DeclarationError(
            f"{key}: pod label {on_label[:40]!r} and annotation {on_annotation[:40]!r} differ"
        )
    return on_label if on_label is not None else on_annotation


def node_verdicts(names: Iterable[str], ranking: Ranking) -> dict[str, Verdict]:
    """Each node's verdict from the ranking: eligible with its best place, or why not (pure).

    The ranking lists eligible candidates first, so a node's first candidate is its best
    one, eligible when any of the node's GPUs is."""
    best: dict[str, tuple[int, Candidate]] = {}
    for position, candidate in enumerate(ranking.candidates):
        best.setdefault(candidate.node, (position, candidate))
    deadline = labels.format_duration(ranking.request.deadline_s)
    verdicts = {}
    for name in names:
        found = best.get(name)
        if found is None:
            verdicts[name] = Verdict(False, message=NO_RECORD)
            continue
        position, candidate = found
        if candidate.eligible:
            verdicts[name] = Verdict(True, position)
            continue
        why = ", ".join(str(r) for r in candidate.reasons)
        message = f"gpuguard: deadline {deadline} cannot be met here ({why})"
        verdicts[name] = Verdict(False, position, message)
    return verdicts


def filter_result(args: ExtenderArgs, verdicts: Mapping[str, Verdict]) -> dict[str, Any]:
    """``ExtenderFilterResult`` as Go marshals it: the passing nodes in the field the
    request used (the other ``null``), every failed one by message in
    ``FailedAndUnresolvableNodes`` (``FailedNodes`` empty), ``Error`` empty."""
    passing = [n for n in args.node_names if verdicts[n].eligible]
    unresolvable = {n: v.message for n, v in verdicts.items() if not v.eligible}
    nodes: dict[str, Any] | None = None
    node_names: list[str] | None = None
    if args.node_items is not None:
        kept = set(passing)
        items = [i for i in args.node_items if i["metadata"].get("name") in kept]
        nodes = {"metadata": {}, "items": items}
    else:
        node_names = passing
    return {
        "Nodes": nodes,
        "NodeNames": node_names,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }


def host_priorities(names: Iterable[str], verdicts: Mapping[str, Verdict]) -> list[dict[str, Any]]:
    """``HostPriorityList``: the eligible nodes in ranking order scored from 10 down to 1,
    evenly; every other node ``MIN_EXTENDER_PRIORITY`` (pure)."""
    names = list(names)
    eligible = sorted(
        (position, n)
        for n in names
        if verdicts[n].eligible and (position := verdicts[n].position) is not None
    )
    top, span = MAX_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY - 1
    last = max(1, len(eligible) - 1)
    score = {name: top - (span * i) // last for i, (_, name) in enumerate(eligible)}
    return [{"Host": n, "Score": score.get(n, MIN_EXTENDER_PRIORITY)} for n in names]


def everywhere(names: Iterable[str], message: str) -> dict[str, Verdict]:
    """The same verdict for every node, unranked: passing (``message`` empty) or failing."""
    if not message:
        return {n: Verdict(True) for n in names}
    return {n: Verdict(False, message=message) for n in names}


class Extender:
    """The two verbs over a ``Placer``: a body in, an ``Answer`` (status and JSON) out."""

    def __init__(self, placer: Placer) -> None:
        self.placer = placer

    def filter(self, body: bytes) -> Answer:
        answer = self._answer(body, filter_result)
        self.placer.count("extender_filter", answer.code)
        return answer

    def prioritize(self, body: bytes) -> Answer:
        answer = self._answer(body, lambda args, v: host_priorities(args.node_names, v))
        self.placer.count("extender_prioritize", answer.code)
        return answer

    def _answer(self, body: bytes, shape: Any) -> Answer:
        try:
            args = parse_args(body)
            verdicts = self._verdicts(args)
        except BadRequest as exc:
            return Answer(400, {"error": str(exc)})
        except RecordsUnavailable as exc:
            log.warning("extender: %s (kube-scheduler goes on without gpuguard)", exc)
            return Answer(503, {"error": str(exc)})
        return Answer(200, shape(args, verdicts))

    def _verdicts(self, args: ExtenderArgs) -> dict[str, Verdict]:
        try:
            request = declared_request(args)
        except DeclarationError as exc:
            log.info("extender: pod %s: %s", args.pod, exc)
            return everywhere(args.node_names, f"gpuguard: {exc}")
        if request is None:  # not real-time: gpuguard has no say
            return everywhere(args.node_names, "")
        return node_verdicts(args.node_names, self.placer.ranking(request))
