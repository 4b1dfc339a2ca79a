"""``gpuguard run --placer.url ...``: ask the placer, then create a Swarm service on its node.

With ``--placer.token-file`` the placement is reserved (``POST /api/v1/placement``): the
placer counts it on its GPU until the records show the container, so runs started together
spread out. Without it, the placer is only asked (``GET``) and nothing is reserved (a placer
without a token cannot take reservations); that is said on stderr.

The service is pinned to the chosen node (``node.id==``) and carries the real-time
constraint ``node.labels.gpuguard.provisionable!=false``, so a node that its actuator has
marked in the meantime takes nothing; the chosen GPU goes in ``NVIDIA_VISIBLE_DEVICES``.
Everything after gpuguard's own flags goes to ``docker service create`` untouched.

Swarm nodes are matched to the placer's node names (the exporters' ``--node.name``) by the
node label ``gpuguard.node``, else by hostname (unique in the swarm).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import requests

from gpuguard import flags, labels
from gpuguard.commands.errors import PlacementFailed, ServiceUnreachable
from gpuguard.commands.launch import exec_docker, run_labels, split_run_flags
from gpuguard.commands.service import PLACER, call_json, get_json, http_config
from gpuguard.flags import ConfigError
from gpuguard.labels import NODE, PLACEMENT, PROVISIONABLE

RT_CONSTRAINT = f"node.labels.{PROVISIONABLE}!=false"
VALUED = (
    "--deadline", "--task", "--docker.host", "--placer.url", "--placer.token-file",
    "--placer.http-config-file", "--memory", "--runtime", "--gpu-model",
)  # fmt: skip
USAGE = (
    "usage: gpuguard run --placer.url URL --deadline DURATION --memory BYTES [--runtime DURATION]"
    " [--gpu-model NAME] [--placer.token-file PATH] [--placer.http-config-file PATH]"
    " [--managed] [--docker.host URL]"
    " [DOCKER SERVICE CREATE OPTIONS] IMAGE [COMMAND [ARG...]]"
)


def wants_placer(argv: Sequence[str]) -> bool:
    """Whether ``run``'s own flags name a placer (then it makes a Swarm service)."""
    try:
        found, _ = split_run_flags(argv, VALUED)
    except ConfigError:
        return any(arg.partition("=")[0] == "--placer.url" for arg in argv)
    return "--placer.url" in found


def run_service(argv: Sequence[str]) -> int:
    """Place and create the service; exec's the docker CLI (returns only on failure)."""
    try:
        found, rest = split_run_flags(argv, VALUED)
        cmd = service_argv(found, rest, place(found), swarm_nodes(found.get("--docker.host")))
    except (ConfigError, PlacementFailed, ServiceUnreachable) as exc:
        print(f"gpuguard run: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    return exec_docker(cmd)


def place(found: dict[str, str]) -> dict[str, Any]:
    """The placer's answer for these flags; PlacementFailed with the reason otherwise."""
    run_labels(found)  # a bad deadline fails here, before the placer is asked
    if "--memory" not in found:
        raise ConfigError("--memory is required with --placer.url (e.g. --memory 2GiB)")
    params = {"deadline": placer_duration("--deadline", found["--deadline"]),
              "memory": found["--memory"]}  # fmt: skip
    if "--runtime" in found:
        params["runtime"] = placer_duration("--runtime", found["--runtime"])
    if "--gpu-model" in found:
        params["gpu_model"] = found["--gpu-model"]
    tls_auth = http_config(found.get("--placer.http-config-file"), "placer")
    identified = tls_auth.username is not None or tls_auth.cert_file is not None
    if "--placer.token-file" in found or identified:
        # a reservation needs to say who asks: the token, or what the placer's web config
        # authenticates (basic auth, a client certificate)
        headers = {}
        if "--placer.token-file" in found:
            token = flags.read_token(found["--placer.token-file"], "placer.token-file")
            headers["Authorization"] = f"Bearer {token}"
        url = found["--placer.url"]
        reply = call_json(PLACER, "POST", url, "/api/v1/placement", params, headers, 10.0, tls_auth)
    else:
        print(
            "gpuguard run: no --placer.token-file: the placement is not reserved (runs "
            "started together may be placed on the same GPU)",
            file=sys.stderr,
        )
        reply = get_json(
            PLACER, found["--placer.url"], "/api/v1/placement", params, None, 10.0, tls_auth
        )
    doc = reply.doc
    if reply.status == 429:
        raise PlacementFailed(f"placer: {doc.get('error', 'too many reservations')}, retry later")
    if reply.status == 409:
        raise PlacementFailed(f"no node can take it now: {_reasons(doc)}")
    if reply.status != 200:
        raise PlacementFailed(f"the placer answered {reply.error()}")
    print(f"gpuguard run: node {doc['node']}, GPU {doc['gpu']}: {doc['why']}", file=sys.stderr)
    return dict(doc)


def placer_duration(flag: str, text: str) -> str:
    """A duration as a container label may spell it (``9``, ``1m30s``) in the placer's
    spelling (``9000ms``), so the label and the placement agree."""
    try:
        seconds = labels.parse_duration(text)
    except labels.LabelError as exc:
        raise ConfigError(f"{flag}: {exc}") from None
    return f"{seconds * 1000:.6f}".rstrip("0").rstrip(".") + "ms"


def _reasons(doc: dict[str, Any]) -> str:
    ranked = doc.get("ranked", [])[:5]
    return (
        "; ".join(
            f"{c['node']}/{c['gpu']}: {', '.join(c['reasons']) or 'eligible'}" for c in ranked
        )
        or "no nodes with a record"
    )


def swarm_nodes(docker_host: str | None) -> list[dict[str, Any]]:
    """The swarm's nodes as the manager lists them."""
    import docker
    import docker.errors

    try:
        client = docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env()
        try:
            return [dict(node.attrs) for node in client.nodes.list()]
        finally:
            client.close()
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise PlacementFailed(f"cannot list the swarm's nodes: {exc}") from None


def swarm_node_id(nodes: list[dict[str, Any]], name: str) -> str:
    """The Swarm node id of the placer's node ``name`` (pure)."""
    by_label = [n for n in nodes if (n["Spec"].get("Labels") or {}).get(NODE) == name]
    by_host = [n for n in nodes if n.get("Description", {}).get("Hostname") == name]
    for matches in (by_label, by_host):
        if len(matches) == 1:
            return str(matches[0]["ID"])
    if len(by_host) > 1:
        raise PlacementFailed(f"{len(by_host)} swarm nodes are called {name}: label them "
                              f"with {NODE}=<exporter --node.name>")  # fmt: skip
    raise PlacementFailed(f"no swarm node is {name} (label {NODE} or hostname)")


def service_argv(
    found: dict[str, str], rest: list[str], answer: dict[str, Any], nodes: list[dict[str, Any]]
) -> list[str]:
    """The ``docker service create`` command for a placed container (pure)."""
    if not rest:
        raise ConfigError("an IMAGE is required")
    cmd = ["docker"]
    if "--docker.host" in found:
        cmd += ["-H", found["--docker.host"]]
    cmd += ["service", "create"]
    cmd += ["--constraint", f"node.id=={swarm_node_id(nodes, answer['node'])}"]
    cmd += ["--constraint", RT_CONSTRAINT]
    for key, value in run_labels(found).items():
        cmd += ["--container-label", f"{key}={value}"]
    cmd += ["--label", f"{PLACEMENT}={answer['node']}/{answer['gpu']}"]
    cmd += ["--env", f"NVIDIA_VISIBLE_DEVICES={answer['gpu']}"]
    return cmd + rest
