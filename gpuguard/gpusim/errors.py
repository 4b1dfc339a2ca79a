"""gpusim's error codes and exceptions, shared by the daemon and the client."""

from __future__ import annotations

BAD_REQUEST = "bad_request"
NO_CONTEXT = "no_context"
CONTEXT_EXISTS = "context_exists"
OUT_OF_MEMORY = "out_of_memory"
INVALID_HANDLE = "invalid_handle"
INVALID_DEVICE = "invalid_device"
#: Client side only: the daemon cannot be reached or closed the connection.
UNAVAILABLE = "unavailable"

ERROR_CODES = frozenset(
    {BAD_REQUEST, NO_CONTEXT, CONTEXT_EXISTS, OUT_OF_MEMORY, INVALID_HANDLE, INVALID_DEVICE}
)


class GpusimError(Exception):
    """A request the daemon refused (``code`` is one of the protocol's error codes)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class OutOfMemory(GpusimError):
    """The device has not enough free memory (cudaMalloc cannot over-commit)."""


class DaemonUnavailable(GpusimError):
    """The daemon's socket cannot be reached, or the daemon closed the connection."""

    def __init__(self, message: str) -> None:
        super().__init__(UNAVAILABLE, message)


def error_for(code: str, message: str) -> GpusimError:
    """The exception that stands for an ``{"ok": false}`` reply."""
    if code == OUT_OF_MEMORY:
        return OutOfMemory(code, message)
    return GpusimError(code, message)
