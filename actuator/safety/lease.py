"""Heartbeats in the state directory: the actuator's lease, read by the guard, and back.

A lease file holds who renewed it and when, on ``CLOCK_BOOTTIME``: one clock for every
container on the host (unlike a PID, which the guard in another container cannot wait on),
never stepped by NTP (unlike wall time, which could make a live actuator look dead), and
counting suspended time. Renewals are small atomic replaces without fsync: after a power cut
there is no actuator to vouch for anyway.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpuguard import files

ACTUATOR_LEASE = "actuator.safety.lease"
GUARD_LEASE = "guard.lease"


def boottime() -> float:
    """Seconds since boot, suspend included; the same for every process on the host."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Lease:
    """One renewal: who (PID in its own namespace, for people) and when (boot time)."""

    pid: int
    renewed: float

    def age(self, now: float | None = None) -> float:
        return (boottime() if now is None else now) - self.renewed


def renew(path: Path) -> None:
    """Write a fresh lease for this process at ``path``."""
    data = json.dumps({"pid": os.getpid(), "renewed": boottime()}).encode()
    files.replace(path, data, durable=False)


def age(path: Path) -> float:
    """Seconds since the lease at ``path`` was renewed; infinity when there is none."""
    held = read(path)
    return math.inf if held is None else held.age()


def read(path: Path) -> Lease | None:
    """The last renewal at ``path``, or None when there is none (or it is unreadable)."""
    try:
        doc = json.loads(files.read_bytes(path, 4096, follow_symlinks=False))
        renewed = float(doc["renewed"])
        return Lease(int(doc["pid"]), renewed) if math.isfinite(renewed) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
