"""gpusim's stand-in for the CUDA driver library (``native/cudastub.c``), and its use.

The daemon puts ``libcuda.so.1`` beside its socket (``install``), so every workload container
that mounts the socket's directory maps that one host file, as the NVIDIA container toolkit
mounts the host's driver: a uprobe on it sees every container's calls. A workload process
calls its entry points through ``DriverCalls`` at the moments a CUDA program would: the call
runs the simulated operation inside the stub's hook, so a synchronize returns when the
simulated work is done. Only a file that carries the stub's marker symbol is ever loaded: a
real driver is never called with made-up arguments.
"""

from __future__ import annotations

import ctypes
import logging
import shutil
from collections.abc import Callable
from enum import IntEnum
from pathlib import Path
from typing import TypeVar

from gpuguard.native import NativeBuildError, build

log = logging.getLogger(__name__)

#: the file name the toolkit mounts, kept beside the daemon's socket
LIBRARY_NAME = "libcuda.so.1"
SOURCE = Path(__file__).parent / "native" / "cudastub.c"
_MARKER = "gpusim_driver_stub"
T = TypeVar("T")


class CallKind(IntEnum):
    """What the stub tells its hook (``cudastub.c``'s enum)."""

    LAUNCH = 1
    COPY = 2  # host to device (an input)
    WAIT = 3
    QUERY = 4
    COPY_OUT = 5  # device to host (an output)


def stub_library() -> Path:
    """The built stand-in (cached); raises ``NativeBuildError`` without gcc."""
    command = ["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Wno-unused-parameter"]
    return build(LIBRARY_NAME, [SOURCE], [[*command, "-o", "{out}", SOURCE.name]])


def install(directory: Path) -> Path | None:
    """Copy the stand-in into ``directory`` (a fresh file: probes there see only its users).

    Returns its path, or None (logged) when it cannot be built: workloads then run as
    before, without driver calls.
    """
    target = directory / LIBRARY_NAME
    partial = directory / f".{LIBRARY_NAME}.partial"
    try:
        shutil.copy(stub_library(), partial)
        partial.chmod(0o755)
        partial.replace(target)
    except (NativeBuildError, OSError) as exc:
        log.warning("no driver stand-in in %s: %s", directory, exc)
        return None
    return target


_HOOK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)


class DriverCalls:
    """Runs simulated operations inside the stand-in's entry points of one process."""

    def __init__(self, library: Path) -> None:
        self._lib = ctypes.CDLL(str(library))
        try:
            ctypes.c_char.in_dll(self._lib, _MARKER)
        except ValueError:
            raise OSError(f"{library} is not gpusim's driver stand-in") from None
        self._pending: Callable[[], object] | None = None
        self._result: object = None
        self._hook = _HOOK(self._run)  # kept referenced: the library holds the pointer
        self._lib.gpusim_set_hook(self._hook)
        null = ctypes.c_void_p()
        one = ctypes.c_uint(1)
        self._calls: dict[CallKind, Callable[[], int]] = {
            CallKind.LAUNCH: lambda: self._lib.cuLaunchKernel(
                null, one, one, one, one, one, one, ctypes.c_uint(0), null, null, null
            ),
            CallKind.COPY: lambda: self._lib.cuMemcpyHtoDAsync_v2(
                ctypes.c_ulonglong(0), null, ctypes.c_size_t(0), null
            ),
            CallKind.COPY_OUT: lambda: self._lib.cuMemcpyDtoHAsync_v2(
                null, ctypes.c_ulonglong(0), ctypes.c_size_t(0), null
            ),
            CallKind.WAIT: lambda: self._lib.cuStreamSynchronize(null),
            CallKind.QUERY: lambda: self._lib.cuStreamQuery(null),
        }

    def _run(self, _kind: int) -> int:
        action, self._pending = self._pending, None
        if action is not None:
            self._result = action()
        return 0

    def call(self, kind: CallKind, action: Callable[[], T]) -> T:
        """Call ``kind``'s entry point; ``action`` runs inside it and its result is returned
        (an exception in ``action`` propagates after the entry point returns)."""
        error: BaseException | None = None

        def guarded() -> object:
            nonlocal error
            try:
                return action()
            except BaseException as exc:  # re-raised outside the C frame
                error = exc
                return None

        self._pending = guarded
        self._calls[kind]()
        if error is not None:
            raise error
        result, self._result = self._result, None
        return result  # type: ignore[return-value]


def find_stub(socket_path: Path | None) -> DriverCalls | None:
    """The stand-in beside a daemon's socket, loaded; None when there is none."""
    if socket_path is None:
        return None
    library = Path(socket_path).parent / LIBRARY_NAME
    if not library.is_file():
        return None
    try:
        return DriverCalls(library)
    except OSError as exc:
        log.warning("driver stand-in %s not used: %s", library, exc)
        return None


if __name__ == "__main__":  # ``make setup``: build it now; a failure is one line, not fatal
    try:
        print(f"gpusim driver stand-in: {stub_library()}")
    except NativeBuildError as exc:
        print(f"gpusim driver stand-in: not built ({exc})")
