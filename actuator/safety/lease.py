"""Heartbeats in the state directory: the actuator's lease, read by the guard, and back.

A lease file holds who renewed it and when, on ``CLOCK_BOOTTIME``: one clock for every
container on the host (unlike a PID, which the guard in another container cannot wait on),
never stepped by NTP (unlike wall time, which could make a live actuator look dead), and
counting suspended time. Renewals are small atomic replaces without fsync: after a power cut
there is no actuator to vouch for anyway.

A renewal that cannot be written (the state directory full or read-only) is reported to
``StateWrites`` and tried again at the next one, never raised: nothing that renews a lease
may stop for it, least of all the guard on its way to a resume. A directory in a lease's
place is moved aside for the operator (``*.bad-*``), as a link at ``journal.lock`` is.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpuguard import files
from gpuguard.actuator.safety.statewrites import StateWrites

ACTUATOR_LEASE = "actuator.lease"
#: the name one release gave the actuator's lease: renewed and read beside ACTUATOR_LEASE,
#: so an actuator and a guard of different releases see each other alive
ACTUATOR_LEASE_ALIASES = ("actuator.safety.lease",)
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


def renew(path: Path, writes: StateWrites | None = None) -> bool:
    """Write a fresh lease for this process at ``path``; False (reported to ``writes``)
    when it cannot be written."""
    writes = writes or StateWrites()
    data = json.dumps({"pid": os.getpid(), "renewed": boottime()}).encode()
    try:
        try:
            files.replace(path, data, durable=False)
        except IsADirectoryError:
            kept = files.set_aside(path, "bad")
            writes.log.error("%s: a directory: moved to %s", path, kept.name)
            files.replace(path, data, durable=False)
    except OSError as exc:
        writes.failed("lease", path, exc)
        return False
    writes.ok("lease")
    return True


def renew_actuator(state_dir: Path, writes: StateWrites | None = None) -> bool:
    """Renew the actuator's lease in ``state_dir`` under its name and every alias; False
    when the lease under its own name cannot be written."""
    written = renew(state_dir / ACTUATOR_LEASE, writes)
    for alias in ACTUATOR_LEASE_ALIASES:
        renew(state_dir / alias, writes)
    return written


def read_actuator(state_dir: Path) -> Lease | None:
    """The actuator's freshest renewal in ``state_dir`` under its name or an alias."""
    held = [read(state_dir / name) for name in (ACTUATOR_LEASE, *ACTUATOR_LEASE_ALIASES)]
    return max((h for h in held if h is not None), key=lambda h: h.renewed, default=None)


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
