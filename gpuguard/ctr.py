"""containerd through Debian's ``ctr``: the client the exporter's container source and the
actuator's containerd engine share (docs/kubernetes.md says why ``ctr`` and not the index's gRPC
package). Every failure is ``CtrError``; parsing is pure (``parse_task_list``, ``trim_info``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from typing import Any

CTR_TIMEOUT_S = 10.0

# A task's status (``ctr tasks list``) in Docker's words, as ContainerInfo keeps them.
_TASK_STATUS = {
    "CREATED": "created",
    "RUNNING": "running",
    "PAUSING": "running",
    "PAUSED": "paused",
    "STOPPED": "exited",
}


class CtrError(RuntimeError):
    """``ctr`` failed: containerd unreachable, or it refused; the caller decides by state."""


def parse_task_list(text: str) -> dict[str, str]:
    """``ctr tasks list`` (TASK PID STATUS) -> container id -> state in Docker's words."""
    states = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3:
            states[fields[0]] = _TASK_STATUS.get(fields[2].upper(), "unknown")
    return states


def parse_task_pids(text: str) -> dict[str, int]:
    """``ctr tasks list`` -> container id -> the host PID of its task's init process."""
    pids = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[1].isdigit():
            pids[fields[0]] = int(fields[1])
    return pids


def trim_info(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``ctr containers info`` the exporter keeps (the OCI spec is large)."""
    spec = doc.get("Spec") or {}
    process = spec.get("process") or {}
    linux = spec.get("linux") or {}
    return {
        "ID": str(doc["ID"]),
        "Labels": dict(doc.get("Labels") or {}),
        "Image": str(doc.get("Image") or ""),
        "Args": list(process.get("args") or ()),
        "Env": list(process.get("env") or ()),
        "CgroupsPath": str(linux.get("cgroupsPath") or ""),
    }


class Ctr:
    """containerd through Debian's ``ctr``, one namespace; every failure is CtrError."""

    def __init__(self, address: str, namespace: str, binary: str = "ctr") -> None:
        self.address = address.removeprefix("unix://")
        self.namespace = namespace
        self.binary = binary

    def _base(self) -> list[str]:
        return [self.binary, "--address", self.address, "--namespace", self.namespace]

    def run(self, *args: str) -> str:
        try:
            done = subprocess.run(
                [*self._base(), *args],
                capture_output=True,
                text=True,
                timeout=CTR_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CtrError(f"ctr {' '.join(args[:2])}: {exc}") from exc
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["failed"])[-1]
            raise CtrError(f"ctr {' '.join(args[:2])}: {why}")
        return done.stdout

    def container_ids(self) -> list[str]:
        return self.run("containers", "list", "--quiet").split()

    def info(self, container_id: str) -> dict[str, Any]:
        try:
            return trim_info(json.loads(self.run("containers", "info", container_id)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CtrError(f"ctr containers info {container_id}: {exc}") from exc

    def task_states(self) -> dict[str, str]:
        return parse_task_list(self.run("tasks", "list"))

    def tasks(self) -> tuple[dict[str, str], dict[str, int]]:
        """Each task's state and PID, from one ``ctr tasks list``."""
        text = self.run("tasks", "list")
        return parse_task_list(text), parse_task_pids(text)

    def follow_events(self) -> subprocess.Popen[str]:
        try:
            return subprocess.Popen(
                [*self._base(), "events"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        except OSError as exc:
            raise CtrError(f"ctr events: {exc}") from exc
