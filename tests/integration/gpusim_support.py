"""Workload containers on a gpusim daemon: their command lines, mounts and logs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from gpuguard.demo.stack.gpusim import GpusimService


def workload(sim: GpusimService, name: str, *args: str) -> list[str]:
    """``python -m`` arguments of a workload logging to ``<sim.dir>/<name>.log``.

    ``args`` may start with the kind (``server``, ``train``); oneshot is the default.
    """
    kind = [args[0]] if args and not args[0].startswith("-") else []
    log = sim.dir / f"{name}.log"
    rest = args[len(kind) :]
    return [
        "gpuguard.gpusim.workload",
        *kind,
        "--socket",
        str(sim.socket),
        "--log",
        str(log),
        *rest,
    ]


def mounts(sim: GpusimService) -> dict[str, dict[str, str]]:
    """The daemon's directory (socket and logs) at the same path inside the container."""
    return {str(sim.dir): {"bind": str(sim.dir), "mode": "rw"}}


def read_log(sim: GpusimService, name: str) -> list[dict[str, Any]]:
    """Every complete line of a workload's log."""
    path = sim.dir / f"{name}.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def read_events(sim: GpusimService, name: str) -> dict[str, dict[str, Any]]:
    """The last event of each kind in a workload's log."""
    return {event["event"]: event for event in read_log(sim, name)}


def wait_event(sim: GpusimService, name: str, event: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (found := read_events(sim, name).get(event)) is None:
        assert time.monotonic() < deadline, f"{name}: no {event} after {timeout}s"
        time.sleep(0.005)
    return found


def exit_code(container: Any, timeout: float = 60) -> int:
    return int(container.wait(timeout=timeout)["StatusCode"])


def kernel_s(events: dict[str, dict[str, Any]]) -> float:
    """A one-shot run's kernels on the device's clock (no host scheduling in it)."""
    end = events["kernel_end"]
    return float(end["device_ended"] - end["device_started"])


def host_pid(container: Any) -> int:
    container.reload()
    return int(container.attrs["State"]["Pid"])


def gpusim_status(sim: GpusimService) -> dict[str, Any]:
    """``gpusim status --json``, the command line an operator would use."""
    argv = [
        sys.executable,
        "-m",
        "gpuguard.gpusim",
        "status",
        "--socket",
        str(sim.socket),
        "--json",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    status: dict[str, Any] = json.loads(out)
    return status
