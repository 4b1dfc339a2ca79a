"""gpusim backend: the simulated GPU's ``sample`` op (docs/interfaces.md §1) as a GpuSample.

``parse_sample`` is pure; ``GpusimBackend`` asks gpusim's own client. Like NVML's
``lastSeenTimeStamp``, each request passes the previous reply's ``timestamp_us`` as
``since_us`` so a per-process sample is seen once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from gpuguard.exporter.errors import BackendError
from gpuguard.exporter.model import DeviceSample, GpuProcess, GpuSample, ProcessUtilization

_REQUEST_TIMEOUT_S = 2.0


class SampleClient(Protocol):
    def sample(self, since_us: int = 0) -> Mapping[str, Any]: ...


def parse_sample(reply: Mapping[str, Any]) -> GpuSample:
    """Turn a ``sample`` reply into a ``GpuSample``; a malformed reply is a BackendError."""
    try:
        devices = tuple(_parse_device(d) for d in reply["devices"])
        return GpuSample(timestamp=int(reply["timestamp_us"]) / 1e6, devices=devices)
    except (KeyError, TypeError, ValueError) as exc:
        raise BackendError(f"gpusim: malformed sample reply ({exc!r})") from exc


def _parse_device(doc: Mapping[str, Any]) -> DeviceSample:
    # A MIG device reports no utilization (None) and carries its instance index.
    utilization = doc.get("utilization_ratio")
    mig_index = doc.get("mig_index")
    return DeviceSample(
        index=int(doc["index"]),
        uuid=str(doc["uuid"]),
        name=str(doc["name"]),
        memory_total_bytes=int(doc["memory_total_bytes"]),
        memory_used_bytes=int(doc["memory_used_bytes"]),
        utilization_ratio=None if utilization is None else float(utilization),
        processes=tuple(
            GpuProcess(
                pid=int(p["pid"]),
                used_memory_bytes=(
                    None if p.get("used_memory_bytes") is None else int(p["used_memory_bytes"])
                ),
            )
            for p in doc.get("processes", ())
        ),
        process_samples=tuple(
            ProcessUtilization(
                pid=int(s["pid"]),
                timestamp_us=int(s["timestamp_us"]),
                sm_ratio=float(s["sm_ratio"]),
                mem_ratio=float(s.get("mem_ratio", 0.0)),
            )
            for s in doc.get("process_samples", ())
        ),
        mig_index=None if mig_index is None else int(mig_index),
        # gpusim numbers its GPU instances like its MIG devices unless it says otherwise.
        gpu_instance_id=None if mig_index is None else int(doc.get("gpu_instance_id", mig_index)),
    )


def no_socket(path: Path) -> str:
    """A missing socket, and the fix: start gpusim there, or say where it listens.

    The exporter keeps polling (gpusim may start after it, or restart), and /healthz
    answers 503 with this line until the first sample.
    """
    return (
        f"no gpusim socket at {path}: start gpusim (`gpusim serve --socket {path}`) "
        "or point --gpusim.socket (or $GPUSIM_SOCKET) at its socket"
    )


def _default_client(socket_path: Path) -> SampleClient:
    from gpuguard.gpusim.client import GpusimClient

    # A timeout so that a hung daemon fails one poll instead of stalling every later one.
    client: SampleClient = GpusimClient(socket_path, timeout=_REQUEST_TIMEOUT_S)
    return client


class GpusimBackend:
    """GPU samples from a gpusim daemon at ``socket_path``."""

    name = "gpusim"

    def __init__(
        self,
        socket_path: Path,
        client_factory: Callable[[Path], SampleClient] = _default_client,
    ) -> None:
        self.socket_path = socket_path
        self._client_factory = client_factory
        self._client: SampleClient | None = None
        self._since_us = 0

    def sample(self) -> GpuSample:
        from gpuguard.gpusim.errors import GpusimError

        try:
            if self._client is None:
                self._client = self._client_factory(self.socket_path)
            reply = self._client.sample(since_us=self._since_us)
        except (GpusimError, OSError) as exc:
            self._drop_client()  # reconnect next poll: the daemon may come back
            if isinstance(exc.__cause__ or exc, FileNotFoundError):
                raise BackendError(no_socket(self.socket_path)) from exc
            raise BackendError(f"gpusim at {self.socket_path}: {exc}") from exc
        sample = parse_sample(reply)
        self._since_us = int(reply["timestamp_us"])
        return sample

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        close = getattr(client, "close", None)
        if close is not None:
            try:
                close()
            except (OSError, RuntimeError):
                pass

    def close(self) -> None:
        self._drop_client()
