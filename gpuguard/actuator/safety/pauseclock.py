"""How long a journalled pause has lasted, on a clock that does not step.

``--max-pause`` was judged on wall time: with the clock stepped back (NTP after a bad start,
an operator, a restored VM) a pause seemed to begin in the future and was never released,
by the actuator or the guard. Each journal entry now also records the moment on
``CLOCK_BOOTTIME`` (the clock the leases use: the same for every process and container on
the host, never stepped, counting suspend) and the boot it belongs to, so the judgement
survives a restart of the actuator or the guard.

An entry without them (a journal written before they existed) or of another boot (its
boot clock means nothing now) is judged from the first moment this process saw it, less
what its wall time says had already passed: a lower bound of the real pause that only grows,
so ``--max-pause`` fires at the latest that long after a restart, whatever the wall clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpuguard import files
from gpuguard.actuator.safety.journaldoc import PausedEntry
from gpuguard.actuator.safety.lease import boottime

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str | None:
    """The kernel's id of this boot (the host's, also inside a container), or None."""
    try:
        return files.read_text(BOOT_ID_FILE, 64).strip() or None
    except (OSError, UnicodeDecodeError):
        return None


class PauseClock:
    """Stamps pauses with the boot clock and says how long each has lasted."""

    def __init__(
        self,
        boot: Callable[[], float] = boottime,
        wall: Callable[[], float] = time.time,
        boot_id: str | None = None,
    ) -> None:
        self._boot = boot
        self._wall = wall
        self.boot_id = boot_id
        #: (container id, paused_at) -> boot time we date it from, for entries without one
        self._dated: dict[tuple[str, float], float] = {}

    def stamp(self, entry: PausedEntry) -> PausedEntry:
        """The entry with this boot's clock reading (entries being recorded now), or, for
        one without a valid reading, the one ``paused_for`` dates it from."""
        if self._valid(entry):
            return entry
        return replace(entry, paused_boot=self._start(entry), boot_id=self.boot_id)

    def paused_for(self, entry: PausedEntry) -> float:
        """Seconds the entry's container has been paused (never negative)."""
        start = entry.paused_boot if self._valid(entry) else self._start(entry)
        assert start is not None
        return max(0.0, self._boot() - start)

    def started_at(self, entry: PausedEntry) -> float:
        """The pause's start as wall time, judged on the boot clock (what the policy's
        best-effort windows count from)."""
        return self._wall() - self.paused_for(entry)

    def forget_except(self, entries: list[PausedEntry]) -> None:
        """Drop the dates of entries no longer in the journal."""
        keep = {(e.container_id, e.paused_at) for e in entries}
        self._dated = {k: v for k, v in self._dated.items() if k in keep}

    def _valid(self, entry: PausedEntry) -> bool:
        return (
            entry.paused_boot is not None
            and self.boot_id is not None
            and entry.boot_id == self.boot_id
            and entry.paused_boot <= self._boot()
        )

    def _start(self, entry: PausedEntry) -> float:
        key = (entry.container_id, entry.paused_at)
        start = self._dated.get(key)
        if start is None:
            now = self._boot()
            already = max(0.0, self._wall() - entry.paused_at)
            start = self._dated[key] = now - already
        return start


_BOOT_ID = boot_id()


def host_clock() -> PauseClock:
    """A clock of this host's boot (the id is read once per process)."""
    return PauseClock(boot_id=_BOOT_ID)
