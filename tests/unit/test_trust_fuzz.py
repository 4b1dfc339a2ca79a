"""Hostile label sets against honest neighbours, seeded.

Each case gives a hostile tenant's container labels drawn from what a tenant may write
(classes in any case, deadlines down to 1e-13 s and in odd notations, SLO declarations, a
spoofed Kubernetes namespace, ``gpuguard.managed`` left out or false, ``gpuguard.role``),
builds it with the exporter's own ``container_info`` and ``/api/v1/state`` rendering, and
lets the actuator's policy decide beside honest tenants that came first
(``tests/support/stealing.py`` has the scenes). A **steal** is what the claims take from an
honest tenant beyond what the same container without claims does (its ``gpuguard.managed``
and ``gpuguard.role`` kept, with the policy's word on them): a pause, a wait while the
hostile tenant keeps the GPU, SLO pressure, or its own misses putting the GPU in state 0.

Under the built-in default there is none, over every class x deadline x SLO claim (540 sets,
the other labels drawn); under trust-all the same search finds the issue's steals. Pure and
bounded: about 4,500 decisions, a few seconds.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard import labels
from gpuguard.contract import COMPONENT_ROLES, Phase, PriorityClass, TaskBoundary, TaskMode
from gpuguard.exporter import trust
from gpuguard.exporter.containers import container_info
from gpuguard.exporter.model import ContainerInfo, DeviceSample, GpuSample
from gpuguard.exporter.record import NodeRecorder, RecordConfig
from gpuguard.exporter.state import _container_json
from gpuguard.exporter.tracker import TaskView
from gpuguard.exporter.trust import TrustPolicy
from tests.support.stealing import (
    CHOICES,
    CLAIMS,
    GIB,
    HONEST,
    HOSTILE,
    NODE,
    NOW,
    SCENES,
    SLO_LABELS,
    held_back,
    hostile_labels,
)

REPO = Path(__file__).resolve().parents[2]
CASES = 150  # label sets where a search draws them at random
SEED = 26


def every_claim(rng: random.Random) -> list[dict[str, str]]:
    """Every class x deadline x SLO a tenant may write (540), the other labels drawn."""
    return [
        hostile_labels(rng, **{labels.CLASS: k, labels.DEADLINE: d, "slo": slo})
        for k in CHOICES[labels.CLASS]
        for d in CHOICES[labels.DEADLINE]
        for slo in ("valid", "junk", None)
    ]


def cid(name: str) -> str:
    return (name.encode().hex() * 64)[:64]


def info_of(name: str, container_labels: dict[str, str], policy: TrustPolicy) -> ContainerInfo:
    """What the exporter's Docker source makes of the container."""
    doc = {
        "Id": cid(name), "Name": f"/{name}", "State": {"Status": "running"},
        "Config": {"Image": "busybox", "Labels": container_labels, "Env": []},
        "HostConfig": {"DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": ["0"]}]},
    }  # fmt: skip
    return container_info(doc, policy)


class _Snap:
    """What ``_container_json`` reads of a poll."""

    default_task_mode = TaskMode.BURST
    demand: dict[str, float] = {}
    typical_run: dict[str, float] = {}
    longest_run: dict[str, float] = {}


def as_state(info: ContainerInfo) -> dict[str, Any]:
    """The container as ``/api/v1/state`` shows it."""
    return _container_json(info, _Snap())  # type: ignore[arg-type]


def marks_the_node(hostile: ContainerInfo) -> bool:
    """Whether three missed tasks of the hostile tenant put the GPU in state 0."""
    if hostile.deadline_s is None:
        return False
    missed = tuple(
        TaskView(
            task_id=f"h:{i}", container_id=hostile.id, pid=7, gpu="0", gpu_index=0,
            mig_index=None, proc_start_ticks=1, order=(NOW - 20 + i, 1, i),
            mode=TaskMode.PROCESS, phase=Phase.ENDED, started_at=NOW - 20 + i,
            memory_bytes=GIB, sm_ratio=0.9, deadline_s=hostile.deadline_s, overrun=True,
            ended_at=NOW - 20 + i + hostile.deadline_s + 5, boundary=TaskBoundary.EXACT,
        )
        for i in range(3)
    )  # fmt: skip
    device = DeviceSample(0, "GPU-0", "gpusim", 24 * GIB, 4 * GIB, 0.5)
    record = NodeRecorder(NODE, RecordConfig()).update(
        NOW, GpuSample(NOW, (device,)), None, (), missed, {hostile.id: hostile}
    )
    return record.state == 0


class Search:
    """Steals under one policy; the honest tenants and the claim-less baselines made once."""

    def __init__(self, policy: TrustPolicy, honest: dict[str, dict[str, str]] = HONEST) -> None:
        self.policy = policy
        self.honest_info = {name: info_of(name, lbls, policy) for name, lbls in honest.items()}
        self.honest = {name: as_state(info) for name, info in self.honest_info.items()}
        self._plain: dict[tuple[tuple[str, str], ...], list[set[str]]] = {}

    def steals(self, hostile_set: dict[str, str]) -> list[tuple[str, str, set[str]]]:
        """(scene, order, what the claims in ``hostile_set`` took) wherever they took any."""
        hostile_info = info_of(HOSTILE, hostile_set, self.policy)
        hostile = as_state(hostile_info)
        plain = tuple(sorted((k, v) for k, v in hostile_set.items() if k not in CLAIMS))
        if plain not in self._plain:
            doc = as_state(info_of(HOSTILE, dict(plain), self.policy))
            self._plain[plain] = [held_back(self.honest, doc, *case) for case in SCENES]
        marks = {"node"} if marks_the_node(hostile_info) else set()
        found = []
        for case, baseline in zip(SCENES, self._plain[plain], strict=True):
            taken = held_back(self.honest, hostile, *case) - baseline | marks
            if taken:
                found.append((*case, taken))
        return found


def fuzz(
    policy: TrustPolicy,
    hostile_sets: list[dict[str, str]],
    honest: dict[str, dict[str, str]] = HONEST,
) -> list[tuple[Any, ...]]:
    search = Search(policy, honest)
    return [(hostile_set, *s) for hostile_set in hostile_sets for s in search.steals(hostile_set)]


def test_the_built_in_default_lets_no_hostile_label_set_take_the_gpu() -> None:
    hostile_sets = every_claim(random.Random(SEED))
    found = fuzz(trust.DEFAULT_POLICY, hostile_sets)
    assert found == [], f"{len(found)} steals in {len(hostile_sets)} label sets: {found[:3]}"


def test_trust_all_lets_them_take_it_which_the_search_sees() -> None:
    """The same search finds the issue's steals when every claim is believed."""
    rng = random.Random(SEED)
    hostile_sets = [hostile_labels(rng) for _ in range(CASES)]
    found = fuzz(trust.TRUST_ALL, hostile_sets)
    kinds = {name for *_, taken in found for name in taken}
    # real-time freezes the trainer and goes before A and C; misses mark the node
    assert {"honest-a", "honest-b", "honest-c", "node"} <= kinds, kinds
    # a tiny deadline jumps an EDF queue without any class
    assert any(
        order == "edf" and labels.CLASS not in hostile_set and "honest-a" in taken
        for hostile_set, _, order, taken in found
    )
    assert len({id(f[0]) for f in found}) > CASES // 10


EXAMPLE = REPO / "deploy" / "trust-policy.example.yml"
#: honest tenants that state their deadlines, as `gpuguard run --deadline 9s` writes them
STATING = {
    **HONEST,
    "honest-a": {labels.DEADLINE: "9s", labels.MANAGED: "true"},
    "honest-c": {labels.DEADLINE: "9s", labels.MANAGED: "true"},
}


def permissive_example() -> TrustPolicy:
    """The example with its commented permissive choice taken (real-time for any deadline of
    1 s or more at large)."""
    text = EXAMPLE.read_text().replace("  classes: [normal, best-effort]\n", "", 1)
    text = text.replace("  # classes: [real-time", "  classes: [real-time").replace(
        "  # real_time_needs_deadline: true", "  real_time_needs_deadline: true"
    )
    return trust.parse_policy(yaml.safe_load(text))


@pytest.mark.parametrize("honest", [HONEST, STATING], ids=["normal-honest", "stating-honest"])
def test_the_example_policy_lets_no_hostile_label_set_take_the_gpu(
    honest: dict[str, dict[str, str]],
) -> None:
    """deploy/trust-policy.example.yml, the file operators copy: over every class x deadline
    x SLO claim and drawn sets, nothing is taken from honest tenants, whether they state
    their deadlines or not."""
    example = trust.load_policy(EXAMPLE)
    rng = random.Random(SEED + 2)
    hostile_sets = every_claim(rng) + [hostile_labels(rng) for _ in range(CASES)]
    found = fuzz(example, hostile_sets, honest)
    assert found == [], f"{len(found)} steals in {len(hostile_sets)} label sets: {found[:3]}"


def test_the_examples_permissive_choice_lets_a_stated_deadline_freeze_the_trainer() -> None:
    """What the commented choice costs, as its comment says: any tenant that writes a
    deadline of 1 s or more is real-time and freezes the best-effort trainer (the search
    sees it); honest tenants that state deadlines stay real-time and lose nothing else."""
    permissive = permissive_example()
    assert Search(permissive, STATING).honest_info["honest-a"].priority_class == (
        PriorityClass.REAL_TIME
    )
    rng = random.Random(SEED + 2)
    hostile_sets = [hostile_labels(rng) for _ in range(CASES)]
    found = fuzz(permissive, hostile_sets, HONEST)
    assert found and all("honest-b" in taken for *_, taken in found), found[:3]
    assert fuzz(permissive, hostile_sets, STATING) == []


MANAGING = trust.parse_policy(
    yaml.safe_load(trust.DEFAULT_DOC.replace("default:\n", "default:\n  managed: true\n"))
)


def test_where_the_policy_manages_every_container_opting_out_takes_nothing() -> None:
    """``managed: true``: leaving out gpuguard.managed, or gpuguard.role=exporter, leaves the
    hostile tenant as pausable as a managed tenant without claims."""
    assert MANAGING.default.managed is True
    rng = random.Random(SEED + 1)
    search = Search(MANAGING)
    baseline = as_state(info_of(HOSTILE, {labels.MANAGED: "true"}, MANAGING))
    held = [held_back(search.honest, baseline, *case) for case in SCENES]
    found = []
    for _ in range(CASES // 2):
        hostile_set = hostile_labels(rng)
        hostile = info_of(HOSTILE, hostile_set, MANAGING)
        assert hostile.managed and hostile.role not in COMPONENT_ROLES
        for case, before in zip(SCENES, held, strict=True):
            extra = held_back(search.honest, as_state(hostile), *case) - before
            if extra:
                found.append((hostile_set, *case, extra))
    assert found == [], found[:3]
    # without the policy's word, opting out (no gpuguard.managed) keeps C waiting: the search
    # sees it
    honest = Search(trust.DEFAULT_POLICY).honest
    opted_out = as_state(info_of(HOSTILE, {}, trust.DEFAULT_POLICY))
    managed = as_state(info_of(HOSTILE, {labels.MANAGED: "true"}, trust.DEFAULT_POLICY))
    assert held_back(honest, opted_out, "free", "fifo") - held_back(honest, managed, "free", "fifo")


@pytest.mark.parametrize("role", ["exporter", "actuator", "guard", "EXPORTER", "tenant"])
def test_the_built_in_default_believes_no_managed_tenants_role(role: str) -> None:
    """A managed tenant that also writes gpuguard.role holds back no honest tenant more than
    the same tenant without it: the role is gpuguard's own containers', not a tenant's."""
    honest = Search(trust.DEFAULT_POLICY).honest
    managed = {labels.MANAGED: "true", labels.TASK: "process"}
    with_role = as_state(info_of(HOSTILE, {**managed, labels.ROLE: role}, trust.DEFAULT_POLICY))
    plain = as_state(info_of(HOSTILE, managed, trust.DEFAULT_POLICY))
    for case in SCENES:
        assert held_back(honest, with_role, *case) == held_back(honest, plain, *case), case


@pytest.mark.parametrize(
    "hostile_set",
    [
        {labels.CLASS: "real-time"},
        {labels.DEADLINE: "0.0000000001ms", labels.TASK: "burst"},
        {labels.CLASS: "real-time", **SLO_LABELS["valid"]},
        {labels.DEADLINE: "1s", labels.TASK: "process"},
    ],
)
def test_the_issues_own_examples(hostile_set: dict[str, str]) -> None:
    """Each steals under trust-all and not under the built-in default."""
    hostile_set = {**hostile_set, labels.MANAGED: "true"}
    assert Search(trust.TRUST_ALL).steals(hostile_set)
    assert not Search(trust.DEFAULT_POLICY).steals(hostile_set)
