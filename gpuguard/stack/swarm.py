"""A Docker Swarm of private engines on loopback, for node-list tests and the demo.

Every engine joins as a manager on its own loopback port, so each node's actuator can
update its own node's labels through its local engine.
"""

from __future__ import annotations

import contextlib
from typing import Any

from gpuguard.stack.dockerd import PrivateDockerd

BASE_PORT = 2377
DATA_PATH_PORT = 4790


def form_swarm(engines: list[PrivateDockerd], base_port: int = BASE_PORT) -> list[str]:
    """Init a swarm on the first engine and join the others; returns node ids in order."""
    clients = [engine.client() for engine in engines]
    try:
        first = clients[0]
        addr = f"127.0.0.1:{base_port}"
        first.swarm.init(advertise_addr=addr, listen_addr=addr, data_path_port=DATA_PATH_PORT)
        token = first.swarm.attrs["JoinTokens"]["Manager"]
        for offset, client in enumerate(clients[1:], start=1):
            own = f"127.0.0.1:{base_port + offset}"
            client.swarm.join(
                remote_addrs=[addr], join_token=token, listen_addr=own, advertise_addr=own
            )
        return [str(client.info()["Swarm"]["NodeID"]) for client in clients]
    finally:
        for client in clients:
            client.close()


def leave_swarm(engines: list[PrivateDockerd]) -> None:
    """Every engine leaves (workers first, then managers); services go with the swarm."""
    for engine in reversed(engines):
        if engine.process is None or not engine.process.alive():
            continue
        client = engine.client(timeout=20)
        with contextlib.suppress(Exception):
            client.swarm.leave(force=True)
        client.close()


def node_labels(client: Any, node_id: str) -> dict[str, str]:
    labels: dict[str, str] = client.nodes.get(node_id).attrs["Spec"].get("Labels") or {}
    return labels
