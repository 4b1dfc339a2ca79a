"""What both forms of ``gpuguard run`` share: gpuguard's leading flags, the container labels
they make, and handing over to the docker CLI."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Collection, Sequence

from gpuguard import labels
from gpuguard.flags import ConfigError


def split_run_flags(
    argv: Sequence[str], valued: Collection[str], switches: Collection[str] = ("--managed",)
) -> tuple[dict[str, str], list[str]]:
    """gpuguard's leading flags (``--flag value``, ``--flag=value``, switches) and the rest.

    The first argument that is not one of them starts the docker arguments. A switch maps
    to ``"true"``; ``ConfigError`` when a flag lacks its value.
    """
    found: dict[str, str] = {}
    rest = list(argv)
    while rest and rest[0].startswith("--"):
        flag, eq, value = rest[0].partition("=")
        if flag in switches and not eq:
            found[flag] = "true"
            rest.pop(0)
            continue
        if flag not in valued:
            break  # the first docker option: everything from here is docker's
        rest.pop(0)
        if not eq:
            if not rest:
                raise ConfigError(f"{flag} needs a value")
            value = rest.pop(0)
        found[flag] = value
    return found, rest


def run_labels(found: dict[str, str]) -> dict[str, str]:
    """The container labels of ``run``'s flags; ``ConfigError`` when one is bad."""
    deadline = found.get("--deadline")
    if deadline is None:
        raise ConfigError("--deadline is required (e.g. --deadline 9s)")
    try:
        labels.parse_duration(deadline)  # validated here; stored as the user wrote it
    except labels.LabelError as exc:
        raise ConfigError(f"--deadline: {exc}") from exc
    out = {labels.DEADLINE: deadline.strip()}
    task = found.get("--task")
    if task is not None:
        try:
            labels.parse_task_mode(task)
        except labels.LabelError as exc:
            raise ConfigError(f"--task: {exc}") from exc
        out[labels.TASK] = task
    if "--managed" in found:
        out[labels.MANAGED] = "true"
    return out


def exec_docker(cmd: list[str]) -> int:
    """Replace this process with the docker CLI running ``cmd[1:]``; 1 when it is missing."""
    docker = shutil.which("docker")
    if docker is None:
        print("gpuguard run: the docker CLI is not installed", file=sys.stderr)
        return 1
    os.execv(docker, [docker, *cmd[1:]])
    return 1  # not reached: execv replaces this process
