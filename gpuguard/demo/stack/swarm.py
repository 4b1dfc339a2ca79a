"""A Docker Swarm of private engines on loopback, for node-list tests and the demo.

Every engine joins as a manager on its own loopback port, so each node's actuator can
update its own node's labels through its local engine.
"""

from __future__ import annotations

import contextlib
import random
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuguard.demo.stack.dockerd import PrivateDockerd
from gpuguard.demo.stack.process import ServiceError, free_port
from gpuguard.labels import NODE

BASE_PORT = 2377
DATA_PATH_PORT = 4790


def form_swarm(engines: list[PrivateDockerd]) -> list[str]:
    """Init a swarm on the first engine and join the others; returns node ids in order.

    Each engine listens on a free loopback port (2377 when free), and the swarm's data path
    on a free UDP port (4790 when free), so swarms of tests running side by side coexist.
    """
    clients = [engine.client() for engine in engines]
    try:
        first = clients[0]
        addr = f"127.0.0.1:{free_port(BASE_PORT)}"
        first.swarm.init(
            advertise_addr=addr, listen_addr=addr, data_path_port=_free_udp_port(DATA_PATH_PORT)
        )
        token = first.swarm.attrs["JoinTokens"]["Manager"]
        for client in clients[1:]:
            own = f"127.0.0.1:{free_port()}"
            client.swarm.join(
                remote_addrs=[addr], join_token=token, listen_addr=own, advertise_addr=own
            )
        return [str(client.info()["Swarm"]["NodeID"]) for client in clients]
    finally:
        for client in clients:
            client.close()


def _free_udp_port(preferred: int) -> int:
    """A UDP port free on this host in the range Docker accepts for the data path."""
    candidates = [preferred, *random.sample(range(20000, 49151), 50)]
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ServiceError("no free UDP port for the swarm's data path")


def leave_swarm(engines: list[PrivateDockerd]) -> None:
    """Every engine leaves, the first (which formed the swarm) last; services go with it.

    The others leave all at once: a manager's forced leave takes about 5 s of its own.
    """
    with ThreadPoolExecutor(max_workers=max(1, len(engines) - 1)) as pool:
        list(pool.map(_leave, engines[1:]))
    if engines:
        _leave(engines[0])


def _leave(engine: PrivateDockerd) -> None:
    if engine.process is None or not engine.process.alive():
        return
    client = engine.client(timeout=20)
    with contextlib.suppress(Exception):
        client.swarm.leave(force=True)
    client.close()


def node_labels(client: Any, node_id: str) -> dict[str, str]:
    labels: dict[str, str] = client.nodes.get(node_id).attrs["Spec"].get("Labels") or {}
    return labels


def name_nodes(engine: PrivateDockerd, names: dict[str, str]) -> None:
    """Label each Swarm node id in ``names`` with ``gpuguard.node=<name>``, via a manager:
    ``gpuguard run --placer.url`` matches nodes by it (the loopback nodes share a hostname)."""
    client = engine.client()
    try:
        for node_id, name in names.items():
            node = client.nodes.get(node_id)
            spec = dict(node.attrs["Spec"])
            spec["Labels"] = {**(spec.get("Labels") or {}), NODE: name}
            node.update(spec)
    finally:
        client.close()
