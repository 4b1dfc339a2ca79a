"""Paper C's node list placing real services on a three-node Swarm (issue 10).

Three private dockerd "nodes" on 127.0.0.1 form one Swarm, each with its own gpusim,
exporter and actuator; one Prometheus scrapes them all and one placer reads the records
from it. Node C's GPU is kept busy (state 0: saturated), node A holds 6 GiB, node B is
free. A real-time service asked through ``gpuguard run --placer.url`` lands where the
placer's ranking says (node B), never on node C (which its actuator also labels
``gpuguard.provisionable=false``); once node B's memory is taken, the next one lands on
node A, and one that fits nowhere is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuguard.demo.stack.images import BASE_IMAGE
from gpuguard.demo.stack.localstack import LocalStack
from gpuguard.demo.stack.swarm import node_labels
from gpuguard.gpusim.client import GpusimClient
from tests.integration.stack_support import with_alerting
from tests.prereq import require_binary
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

GIB = 2**30
MARK = "gpuguard.provisionable"
REQUEST = {"deadline": "9s", "memory": "4GiB"}


@pytest.fixture(scope="module")
def cluster(dockerd: Any, short_tmp: Path) -> Iterator[LocalStack]:
    require_binary("docker")
    stack = LocalStack(
        short_tmp / "placement",
        ["node-a", "node-b", "node-c"],
        time_scale=0.1,
        swarm=True,
        placer_flags=["--records.cache=0.2s", "--placement.settle=2s"],
        default_ports=False,
    )
    yield from with_alerting(stack)


def ranked(cluster: LocalStack, **params: str) -> dict[str, Any]:
    reply = requests.get(cluster.placer_url + "/api/v1/nodes", params=params, timeout=10)
    assert reply.status_code == 200, reply.text
    doc: dict[str, Any] = reply.json()
    return doc


def reasons(cluster: LocalStack, node: str) -> list[str]:
    for candidate in ranked(cluster, **REQUEST)["ranked"]:
        if candidate["node"] == node:
            return list(candidate["reasons"])
    return ["absent"]


def gpuguard_run(
    cluster: LocalStack, name: str, memory: str = "4GiB"
) -> subprocess.CompletedProcess:
    manager = cluster.nodes[0].engine
    assert manager is not None
    argv = [
        sys.executable, "-m", "gpuguard.cli", "run",
        "--placer.url", cluster.placer_url, "--deadline", "9s", "--memory", memory,
        "--docker.host", manager.url,
        "--detach", "--no-resolve-image", "--name", name, BASE_IMAGE, "sleep", "300",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def running_node(client: Any, service_name: str) -> str | None:
    for task in client.services.get(service_name).tasks():
        if task["Status"]["State"] == "running":
            return str(task["NodeID"])
    return None


def test_realtime_services_land_where_the_ranking_says(cluster: LocalStack) -> None:
    node_a, node_b, node_c = cluster.nodes
    id_a, id_b, id_c = cluster.swarm_node_ids
    assert node_a.gpusim and node_b.gpusim and node_c.gpusim
    client = node_a.client()
    holders: list[GpusimClient] = []
    services: list[str] = []
    try:
        busy = GpusimClient(node_c.gpusim.socket)
        holders.append(busy)
        busy.context_create()
        busy.send("kernel", work=5000.0)  # 500 s at time scale 0.1: never idle in this test
        held = GpusimClient(node_a.gpusim.socket)
        holders.append(held)
        held.context_create()
        held.alloc(6 * GIB)

        wait_for(lambda: "saturated" in reasons(cluster, "node-c"), 60, "node C in state 0")
        wait_for(
            lambda: node_labels(client, id_c).get(MARK) == "false",
            60,
            "node C labelled by its actuator (GpuguardNodeInStateZero)",
            interval=0.5,
        )
        listed = ranked(cluster, **REQUEST)
        first = listed["ranked"][0]
        assert (first["node"], first["eligible"]) == ("node-b", True), listed
        assert reasons(cluster, "node-a") == []

        done = gpuguard_run(cluster, "rt-1")
        assert done.returncode == 0, done.stderr
        services.append("rt-1")
        assert "node node-b, GPU 0" in done.stderr
        assert wait_for(lambda: running_node(client, "rt-1"), 60, "rt-1 to run") == id_b
        spec = client.services.get("rt-1").attrs["Spec"]
        container = spec["TaskTemplate"]["ContainerSpec"]
        assert container["Labels"]["gpuguard.deadline"] == "9s"
        assert "NVIDIA_VISIBLE_DEVICES=0" in container["Env"]

        # Node B fills: 20 GiB of its 24 are taken, 4 GiB plus headroom no longer fit.
        filler = GpusimClient(node_b.gpusim.socket)
        holders.append(filler)
        filler.context_create()
        filler.alloc(20 * GIB)
        wait_for(lambda: "memory" in reasons(cluster, "node-b"), 60, "node B full")
        done = gpuguard_run(cluster, "rt-2")
        assert done.returncode == 0, done.stderr
        services.append("rt-2")
        assert wait_for(lambda: running_node(client, "rt-2"), 60, "rt-2 to run") == id_a

        refused = gpuguard_run(cluster, "rt-3", memory="20GiB")
        assert refused.returncode == 1
        assert "no node can take it now" in refused.stderr
        assert "node-c/0: marked, saturated" in refused.stderr  # the record and the label
        assert "rt-3" not in {s.name for s in client.services.list()}
        for name in services:
            assert running_node(client, name) != id_c
    finally:
        for holder in holders:
            holder.close()
        for name in services:
            try:
                client.services.get(name).remove()
            except Exception:  # already gone
                pass
        client.close()


def test_placer_answers_bad_input_with_400(cluster: LocalStack) -> None:
    url = cluster.placer_url + "/api/v1/placement"
    for query in ("deadline=9s", "deadline=9s&memory=1GiB&x=1", "deadline=nan&memory=1"):
        reply = requests.get(f"{url}?{query}", timeout=10)
        assert reply.status_code == 400 and reply.json()["error"], query
    metrics = requests.get(cluster.placer_url + "/metrics", timeout=10).text
    assert "gpuguard_placer_records_up 1.0" in metrics
    started = time.time()
    assert requests.get(cluster.placer_url + "/healthz", timeout=10).status_code == 200
    assert time.time() - started < 5
