"""Helpers for tests on a whole ``LocalStack`` (a node's engine, gpusim, exporter, actuator,
Prometheus and Alertmanager): started once per test, skipped when it cannot start, stopped by
its PIDs; and a gpusim workload container on one of its nodes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpuguard.demo.stack.dockerd import unmount_below
from gpuguard.demo.stack.images import python_container_kwargs
from gpuguard.demo.stack.localstack import LocalStack, NodeStack
from gpuguard.demo.stack.process import ServiceError
from tests.prereq import require_binary, unavailable

#: what a stack with alerting runs: a skip without them (a failure under CI=true)
ALERTING_BINARIES = ("dockerd", "prometheus", "prometheus-alertmanager")


def running(stack: LocalStack) -> Iterator[LocalStack]:
    """A fixture's body: start ``stack`` (a skip when it cannot), yield it, stop it."""
    try:
        stack.start()
    except ServiceError as exc:
        stack.stop()
        unavailable(f"stack did not start: {exc}")
    yield stack
    stack.stop()
    unmount_below(stack.dir)  # the engine's own stop did; a second look costs nothing


def with_alerting(stack: LocalStack) -> Iterator[LocalStack]:
    """``running(stack)`` for a stack with Prometheus and Alertmanager."""
    for binary in ALERTING_BINARIES:
        require_binary(binary)
    yield from running(stack)


def workload(
    node: NodeStack, client: Any, name: str, container_labels: dict[str, str], args: list[str]
) -> Any:
    """A gpusim workload container on ``node``, its /metrics on the host's loopback when it
    serves them (``--metrics-port``)."""
    assert node.gpusim is not None
    kwargs = python_container_kwargs(
        ["gpuguard.gpusim.workload", *args, "--socket", str(node.gpusim.socket)],
        labels=container_labels,
        extra_mounts={str(node.gpusim.dir): {"bind": str(node.gpusim.dir), "mode": "rw"}},
        name=name,
    )
    if "--metrics-port" in args:
        kwargs["network_mode"] = "host"
    return client.containers.run(**kwargs)
