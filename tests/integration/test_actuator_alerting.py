"""Alerts drive the actuator end to end: Prometheus -> Alertmanager -> webhook -> Docker/Swarm.

One node (private dockerd in a single-node Swarm, gpusim, exporter) with the actuator in
``--mode=webhook``, so only alerts make it act: a saturation alert pauses a waiting task, and
a deadline-at-risk alert marks the node so that a new real-time service (placement
constraint ``node.labels.gpuguard.provisionable!=false``) stays pending until the alert
resolves and the node is unmarked.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuguard.actuator.audit import read_audit
from gpuguard.demo.stack.images import python_container_kwargs
from gpuguard.demo.stack.localstack import LocalStack, NodeStack
from gpuguard.demo.stack.swarm import node_labels
from tests.integration.stack_support import with_alerting
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

RT_CONSTRAINT = "node.labels.gpuguard.provisionable!=false"
MARK = "gpuguard.provisionable"
DEADLINE_S = 40.0  # at risk once slack < 20%: 32 s into the task, 8 s before a miss
IDLE_CONTEXT = (
    "import sys, time\n"
    "from gpuguard.gpusim.client import GpusimClient\n"
    "client = GpusimClient(sys.argv[1])\n"
    "client.request('context_create', device=0)\n"
    "time.sleep(300)\n"
)


@pytest.fixture
def stack(dockerd: Any, short_tmp: Path) -> Iterator[LocalStack]:
    """One node in a swarm, its actuator in webhook mode, Prometheus and Alertmanager."""
    stack = LocalStack(
        short_tmp / "act-alerts", ["node-a"], time_scale=0.1, swarm=True, default_ports=False
    )
    node = stack.nodes[0]
    node.actuator_mode = "webhook"
    # The waiting task below holds an idle context: keep it in the queue for the test.
    node.extra_actuator_flags = ["--policy.input-timeout=60s"]
    yield from with_alerting(stack)


def _run(node: NodeStack, client: Any, name: str, labels: dict[str, str], args: list[str]) -> Any:
    assert node.gpusim is not None
    kwargs = python_container_kwargs(
        args,
        labels=labels,
        extra_mounts={str(node.gpusim.dir): {"bind": str(node.gpusim.dir), "mode": "rw"}},
        name=name,
    )
    return client.containers.run(**kwargs)


def test_alerts_pause_a_waiting_task_and_mark_the_node_until_resolved(stack: LocalStack) -> None:
    node = stack.nodes[0]
    assert node.gpusim is not None
    node_id = stack.swarm_node_ids[0]
    client = node.client()
    made: list[Any] = []
    service = None
    try:
        # A managed container that holds an idle GPU context: a task that waits to compute
        # (process mode: in the default burst mode an idle context is no task at all).
        kwargs = python_container_kwargs(
            ["gpuguard.gpusim.workload"],
            labels={"gpuguard.managed": "true", "gpuguard.task": "process"},
            extra_mounts={str(node.gpusim.dir): {"bind": str(node.gpusim.dir), "mode": "rw"}},
            name="idle-context",
        )
        kwargs["command"] = [sys.executable, "-c", IDLE_CONTEXT, str(node.gpusim.socket)]
        idle = client.containers.run(**kwargs)
        made.append(idle)
        time.sleep(0.5)
        busy = _run(
            node,
            client,
            "at-risk",
            # memory mode (paper B's task): exact boundaries, so a deadline risk shows while
            # it runs; a burst would be judged only when it ends (issue 15)
            {"gpuguard.managed": "true", "gpuguard.deadline": f"{DEADLINE_S:g}s",
             "gpuguard.task": "memory"},
            ["gpuguard.gpusim.workload", "--socket", str(node.gpusim.socket),
             "--work-seconds", "600", "--memory-bytes", "1GiB"],
        )  # fmt: skip
        made.append(busy)
        started = time.monotonic()

        # GpuguardGpuSaturatedContention -> webhook -> admission on fresh state: the idle
        # task waits.
        def pauses() -> list[dict[str, Any]]:
            return [
                r
                for r in read_audit(node.base_dir / "actuator" / "audit.jsonl")
                if r.get("event") == "action" and r.get("container_id") == idle.id
            ]

        wait_for(pauses, 30, "the saturation alert to pause the idle task", interval=0.2)
        assert _paused(client, idle)
        assert pauses()[0]["trigger"] == "webhook" and pauses()[0]["result"] == "ok"
        idle.remove(force=True)  # it would otherwise wait long enough for another alert

        # GpuguardTaskDeadlineAtRisk -> mark_node -> Swarm label: a new real-time service is held.
        # (The busy GPU puts the node in state 0 first: GpuguardNodeInStateZero marks it too.)
        wait_for(
            lambda: node_labels(client, node_id).get(MARK) == "false",
            30,
            "node marked",
            interval=0.2,
        )

        def reasons() -> set[str]:
            nodes = requests.get(node.actuator_url + "/api/v1/nodes", timeout=5).json()
            assert nodes["executor"] == "swarm"
            assert nodes["nodes"][0]["provisionable"] is False
            return {r["alertname"] for r in nodes["nodes"][0]["reasons"]}

        wait_for(
            lambda: "GpuguardTaskDeadlineAtRisk" in reasons(), 45, "deadline risk", interval=0.2
        )
        service = client.services.create(
            "gpuguard/base:local", ["sleep", "300"], name="rt-new", constraints=[RT_CONSTRAINT]
        )
        time.sleep(1.5)
        assert _running_task(service) is None
        states = {t["Status"]["State"] for t in service.tasks()}
        assert states <= {"pending", "new"}, states

        # End the task before its deadline (a hit, so no other alert holds the node).
        assert time.monotonic() - started < DEADLINE_S - 0.5, "test too slow to stay a hit"
        busy.remove(force=True)
        wait_for(
            lambda: node_labels(client, node_id).get(MARK) != "false",
            30,
            "node unmarked",
            interval=0.2,
        )
        wait_for(lambda: _running_task(service), 60, "the held service to run", interval=0.2)
        nodes = requests.get(node.actuator_url + "/api/v1/nodes", timeout=5).json()
        assert nodes["nodes"][0]["provisionable"] is True
    finally:
        if service is not None:
            service.remove()
        for container in made:
            try:
                container.remove(force=True)
            except Exception:  # already removed above
                pass
        client.close()


def _paused(client: Any, container: Any) -> bool:
    return bool(client.api.inspect_container(container.id)["State"]["Paused"])


def _running_task(service: Any) -> dict[str, Any] | None:
    for task in service.tasks():
        if task["Status"]["State"] == "running":
            return dict(task)
    return None
