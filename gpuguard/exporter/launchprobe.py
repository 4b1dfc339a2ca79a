"""The launch probe as a source: runs ``gpuguard-launchprobe`` and reads its ticks.

``LaunchProbe.start`` finds the library, checks the capabilities and starts the probe; it
never raises: where the probe cannot run, ``status`` says why (a ``ProbeReason``) and the
exporter goes on with NVML's samples alone. Once attached, a reader thread turns each tick
of the probe's output (docs/interfaces.md §2) into a frozen ``LaunchSample`` and hands it to
``on_tick``, every ``--probe.interval`` and at each time asked for with ``tick_at``; between
ticks, each ``Wake`` (a launch after ``wake_gap_s`` without a launch or a wait's return: a
possible busy edge) goes to ``on_wake`` as soon as the kernel sends it, and each return of
a wait that followed a launch (a possible idle edge) to ``on_quiet``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from gpuguard.contract import ProbeReason
from gpuguard.native import NativeBuildError

log = logging.getLogger(__name__)

#: where the NVIDIA driver installs its library, searched in order
DRIVER_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/lib/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",  # GKE's driver installer; some CUDA images
)
#: capability bits (linux/capability.h)
CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39
_READY_TIMEOUT_S = 15.0
_EXIT_TIMEOUT_S = 5.0
_EXIT_REASONS = {3: ProbeReason.NO_PERMISSION, 4: ProbeReason.NO_LIBRARY}


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    """The ``--probe.*`` flags."""

    enabled: bool = True
    library: Path | None = None
    binary: Path | None = None
    interval_s: float = 0.01
    task_gap_s: float = 0.01
    idle_timeout_s: float = 0.5


@dataclass(frozen=True, slots=True)
class ProcLaunches:
    """One process's driver calls since the probe attached; times are wall-clock seconds."""

    pid: int
    launches: int
    copies: int
    first: float | None  # first launch
    last: float | None  # last launch
    period: float | None  # first launch since the last wait returned
    waits: int
    wait_s: float
    waiting_since: float | None  # a wait in progress
    wait_end: float | None  # return of the last wait
    #: next inputs: host-to-device copies that came after a device-to-host copy that
    #: followed a launch (input, kernels, output, then the next task's input); 0 where the
    #: copies have no direction (``cuMemcpyAsync``) or the probe is older
    inputs: int = 0
    input_start: float | None = None  # the newest next input's first copy
    input_after: float | None = None  # the last launch before it


@dataclass(frozen=True, slots=True)
class LaunchSample:
    """The probe's table at one tick."""

    timestamp: float
    procs: Mapping[int, ProcLaunches]
    gone: frozenset[int]  # processes that exited since the last tick


@dataclass(frozen=True, slots=True)
class Wake:
    """A process's launch after a quiet gap (``w``), or the return of its wait that followed
    a launch (``q``), sent by the probe at once; wall-clock seconds."""

    pid: int
    at: float


@dataclass(frozen=True, slots=True)
class ProbeStatus:
    attached: bool
    reason: ProbeReason | None
    detail: str
    library: str | None = None


def parse_proc(fields: list[str], offset: float) -> ProcLaunches:
    """A ``p`` record's fields (after the ``p``); ``offset`` turns monotonic ns into wall s.

    Ten fields (a probe without the next inputs) or thirteen; fields past the thirteenth
    are skipped. Raises ``ValueError`` for a malformed record.
    """
    if len(fields) != 10 and len(fields) < 13:
        raise ValueError(f"a p record has 10 or 13 fields, got {len(fields)}")
    n = [int(f) for f in fields[:13]]
    if min(n) < 0:
        raise ValueError("negative field in a p record")

    def at(ns: int) -> float | None:
        return ns / 1e9 + offset if ns else None

    pid, launches, copies, first, last, period, waits, wait_ns, wait_start, wait_end = n[:10]
    inputs, input_ns, input_after_ns = n[10:13] if len(n) == 13 else (0, 0, 0)
    return ProcLaunches(
        pid, launches, copies, at(first), at(last), at(period), waits, wait_ns / 1e9,
        at(wait_start), at(wait_end), inputs, at(input_ns), at(input_after_ns),
    )  # fmt: skip


def parse_wake(fields: list[str], offset: float) -> Wake:
    """A ``w`` record's fields (after the ``w``); raises ``ValueError`` when malformed."""
    if len(fields) != 2:
        raise ValueError(f"a w record has 2 fields, got {len(fields)}")
    pid, ns = (int(f) for f in fields)
    if pid <= 0 or ns <= 0:
        raise ValueError("a w record needs a tgid and a time")
    return Wake(pid, ns / 1e9 + offset)


def find_library(explicit: Path | None, gpusim_socket: Path | None) -> Path | None:
    """``--probe.library``, else gpusim's stand-in beside its socket, else the driver's."""
    if explicit is not None:
        return explicit
    candidates = [gpusim_socket.parent / "libcuda.so.1"] if gpusim_socket is not None else []
    candidates += [Path(p) for p in DRIVER_PATHS]
    return next((p for p in candidates if p.is_file()), None)


def missing_capability(status_text: str) -> str | None:
    """None when ``/proc/self/status``'s CapEff allows BPF uprobes, else what is missing."""
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            caps = int(line.split()[1], 16)
            if caps >> CAP_SYS_ADMIN & 1 or (caps >> CAP_BPF & 1 and caps >> CAP_PERFMON & 1):
                return None
            return "needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)"
    return "cannot read the effective capabilities"


class LaunchProbe:
    """One running probe process and its reader thread."""

    def __init__(
        self,
        binary: Callable[[], Path],
        library: Path | None,
        interval_s: float,
        on_tick: Callable[[LaunchSample], None],
        on_wake: Callable[[Wake], None] | None = None,
        wake_gap_s: float = 0.0,
        on_quiet: Callable[[Wake], None] | None = None,
    ) -> None:
        self._binary = binary
        self.library = library
        self.interval_s = interval_s
        self._on_tick = on_tick
        self._on_wake = on_wake
        self._on_quiet = on_quiet
        #: 0, or no ``on_wake``: the probe sends no wakes (edges come with the ticks)
        self.wake_gap_s = wake_gap_s if on_wake is not None else 0.0
        self._process: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self.status = ProbeStatus(False, ProbeReason.FAILED, "not started")
        self._warned: set[str] = set()
        #: the probe ticks on SIGUSR1 (its ready line says "usr1")
        self.asks_ticks = False
        self._asked_lock = threading.Lock()
        self._asked: tuple[float, threading.Timer] | None = None

    def start(self) -> ProbeStatus:
        """Attach; on any obstacle leave ``status`` saying why (logged once)."""
        self.status = self._start()
        if self.status.attached:
            log.info("launch probe attached to %s: %s", self.library, self.status.detail)
        else:
            log.warning("launch probe not running (%s): %s; activity from NVML samples only",
                        self.status.reason, self.status.detail)  # fmt: skip
        return self.status

    def _start(self) -> ProbeStatus:
        if self.library is None:
            return ProbeStatus(False, ProbeReason.NO_LIBRARY, "no libcuda.so.1 found")
        missing = missing_capability(Path("/proc/self/status").read_text())
        if missing is not None:
            return ProbeStatus(False, ProbeReason.NO_PERMISSION, missing)
        try:
            binary = self._binary()
        except (NativeBuildError, OSError) as exc:
            return ProbeStatus(False, ProbeReason.NO_BINARY, str(exc))
        interval_ms = str(max(1, round(self.interval_s * 1000)))
        argv = [str(binary), str(self.library), interval_ms]
        if self.wake_gap_s > 0:
            argv.append(str(max(1, round(self.wake_gap_s * 1e6))))
        try:
            process = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
        except OSError as exc:
            return ProbeStatus(False, ProbeReason.NO_BINARY, f"cannot run {binary}: {exc}")
        assert process.stdout is not None
        ready = _readline_within(process, _READY_TIMEOUT_S)
        if not ready.startswith("ready "):
            process.kill()
            try:
                _, err = process.communicate(timeout=_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # killed while attaching: still detaching
                detail = f"not ready within {_READY_TIMEOUT_S:g} s"
                return ProbeStatus(False, ProbeReason.FAILED, detail, str(self.library))
            reason = _EXIT_REASONS.get(process.returncode or 0, ProbeReason.FAILED)
            detail = (err.strip().splitlines() or [f"exit status {process.returncode}"])[-1]
            return ProbeStatus(False, reason, detail, str(self.library))
        self._process = process
        self._thread = threading.Thread(
            target=self._read, args=(process,), name="launch-probe", daemon=True
        )
        self._thread.start()
        launch, copy, wait, wakes, ticks = [*ready.split(), "-", "-", "-", "-", "-"][1:6]
        self.asks_ticks = ticks == "usr1"
        detail = f"launches {launch}; copies {copy}; waits {wait}"
        if self.wake_gap_s > 0:
            pushed = "pushed" if wakes == "wakes" else "read (no BPF ring buffer: Linux 5.8)"
            detail += f"; busy edges {pushed}"
        if self.asks_ticks:
            detail += "; idle edges timed"
        return ProbeStatus(True, None, detail, str(self.library))

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        procs: dict[int, ProcLaunches] = {}
        gone: set[int] = set()
        offset = time.time() - time.monotonic()
        now = time.time()
        for line in process.stdout:
            if self._process is not process:
                break  # stopped: nothing after stop() is reported
            kind, _, rest = line.partition(" ")
            try:
                if kind == "p":
                    record = parse_proc(rest.split(), offset)
                    procs[record.pid] = record
                elif kind == "w":
                    if self._on_wake is not None:
                        self._on_wake(parse_wake(rest.split(), offset))
                elif kind == "q":
                    if self._on_quiet is not None:
                        self._on_quiet(parse_wake(rest.split(), offset))
                elif kind == "x":
                    pid = int(rest)
                    procs.pop(pid, None)
                    gone.add(pid)
                elif kind == "t":
                    offset = time.time() - time.monotonic()
                    now = int(rest) / 1e9 + offset
                elif kind == ".\n":
                    self._on_tick(LaunchSample(now, MappingProxyType(dict(procs)), frozenset(gone)))
                    gone = set()
            except ValueError as exc:
                self._warn_once(f"launch probe: bad record {line!r}: {exc}")
            except Exception as exc:  # the reader's boundary: one bad tick must not stop it
                self._warn_once(f"launch probe: tick failed: {exc!r}", exc_info=True)
        code = process.wait()  # here, in the reader's thread, so stop() need not wait
        if self._process is not process:
            return  # stopped on purpose
        err = process.stderr.read().strip() if process.stderr else ""
        self.status = ProbeStatus(
            False, ProbeReason.FAILED, err or f"probe exited ({code})", str(self.library)
        )
        log.warning("launch probe stopped: %s", self.status.detail)

    def tick_at(self, at: float) -> None:
        """Have the probe read its table at wall time ``at`` as well as every interval (a
        busy period's end is due then). One request waits at a time, the earliest: each
        tick's reader asks again for the next one. A probe that cannot is read at its
        interval only."""
        if not self.asks_ticks:
            return
        with self._asked_lock:
            if self._asked is not None:
                if self._asked[0] <= at:
                    return
                self._asked[1].cancel()
            timer = threading.Timer(max(0.0, at - time.time()), self._ask_tick)
            timer.daemon = True
            self._asked = (at, timer)
            timer.start()

    def _ask_tick(self) -> None:
        with self._asked_lock:
            self._asked = None
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGUSR1)

    def _warn_once(self, message: str, exc_info: bool = False) -> None:
        """Log a message the first time only: the reader runs every 10 ms."""
        if message not in self._warned and len(self._warned) < 100:
            self._warned.add(message)
            log.warning(message, exc_info=exc_info)

    def stop(self) -> None:
        """Stop the probe: SIGTERM ends it at once and its uprobes go with it.

        Its exit is not waited for: the kernel detaches the uprobes one grace period at a
        time (seconds for the ~30 of them), and the reader ends on its own at end of output.
        """
        process, self._process = self._process, None
        with self._asked_lock:
            if self._asked is not None:
                self._asked[1].cancel()
                self._asked = None
        if process is not None and process.poll() is None:
            process.terminate()


def _readline_within(process: subprocess.Popen[str], timeout: float) -> str:
    """The first line of stdout, or "" if none comes within ``timeout`` (or at exit)."""
    assert process.stdout is not None
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    return line[0] if line else ""


def installed_binary() -> Path | None:
    """``gpuguard-launchprobe`` on PATH, as a DaemonSet image ships it."""
    found = shutil.which("gpuguard-launchprobe")
    return Path(found) if found and os.access(found, os.X_OK) else None
