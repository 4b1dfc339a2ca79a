"""The wire protocol (docs/interfaces.md section 1): one JSON object per line each way.

Parsing is pure: a request line becomes a validated ``Request`` or a ``GpusimError`` with
code ``bad_request``, before anything touches the daemon's state.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from gpuguard.gpusim.errors import BAD_REQUEST, GpusimError

#: Longest request line accepted; requests are tiny, so anything longer is garbage.
MAX_LINE_BYTES = 64 * 1024

WORKLOAD_OPS = frozenset(
    {
        "context_create", "alloc", "free", "copy_in", "copy_out", "kernel", "launch",
        "event_record", "synchronize", "context_destroy",
    }
)  # fmt: skip
QUERY_OPS = frozenset({"sample", "status"})
OPS = WORKLOAD_OPS | QUERY_OPS


@dataclass(frozen=True)
class Request:
    """A validated request: its op and its typed arguments."""

    op: str
    args: dict[str, Any]


def _bad(message: str) -> GpusimError:
    return GpusimError(BAD_REQUEST, message)


def _int_arg(obj: dict[str, Any], name: str, minimum: int, required: bool = True) -> int | None:
    if name not in obj:
        if required:
            raise _bad(f"missing argument {name!r}")
        return None
    value = obj[name]
    # bool is an int in Python but never a valid size, handle or device.
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad(f"argument {name!r} must be an integer, got {json.dumps(value)}")
    if value < minimum:
        raise _bad(f"argument {name!r} must be >= {minimum}, got {value}")
    return value


def _positive_number(obj: dict[str, Any], name: str) -> float:
    value = obj[name]
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _bad(f"argument {name!r} must be a number, got {json.dumps(value)}")
    if not math.isfinite(value) or value <= 0:
        raise _bad(f"argument {name!r} must be a finite number > 0, got {value}")
    return float(value)


def _kernel_args(obj: dict[str, Any]) -> dict[str, Any]:
    """Exactly one of ``work`` (device-seconds) or ``flops``."""
    given = [name for name in ("work", "flops") if name in obj]
    if len(given) != 1:
        raise _bad("a kernel needs exactly one of 'work' (seconds) or 'flops'")
    return {given[0]: _positive_number(obj, given[0])}


# NVIDIA_VISIBLE_DEVICES forms: an index, <gpu>:<mig>, or a GPU-/MIG- UUID.
_ADDRESS = re.compile(r"^(?:[0-9]+(?::[0-9]+)?|(?:GPU|MIG)-[0-9A-Za-z-]+)$")


def parse_device(value: Any) -> str:
    """A device address as its canonical string (``0``, ``0:1``, ``GPU-...``, ``MIG-...``)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and _ADDRESS.match(value):
        if value[0].isdigit():
            return ":".join(str(int(part)) for part in value.split(":"))
        return value
    raise _bad(
        f"argument 'device' must be an index, '<gpu>:<mig>' or a GPU-/MIG- UUID, "
        f"got {json.dumps(value)}"
    )


def parse_request(line: bytes) -> Request:
    """Decode and validate one request line (without its newline)."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(f"malformed JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise _bad("a request must be a JSON object")
    op = obj.get("op")
    if not isinstance(op, str):
        raise _bad("missing string field 'op'")
    if op not in OPS:
        raise _bad(f"unknown op {op!r}; known: {', '.join(sorted(OPS))}")
    args: dict[str, Any] = {}
    if op == "context_create":
        if "device" not in obj:
            raise _bad("missing argument 'device'")
        args["device"] = parse_device(obj["device"])
    elif op in ("alloc", "copy_in", "copy_out"):
        args["bytes"] = _int_arg(obj, "bytes", 1)
    elif op == "free":
        args["handle"] = _int_arg(obj, "handle", 0)
    elif op in ("kernel", "launch"):
        args.update(_kernel_args(obj))
    elif op == "sample":
        args["since_us"] = _int_arg(obj, "since_us", 0, required=False) or 0
    return Request(op, args)


def encode(message: dict[str, Any]) -> bytes:
    """One message as a JSON line."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def error_reply(error: GpusimError) -> dict[str, Any]:
    """The ``ok: false`` reply for an error."""
    return {"ok": False, "error": error.code, "message": error.message}
