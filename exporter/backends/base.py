"""The GPU backend interface (docs/interfaces.md §2) and the ``--gpu.backend`` choice."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from gpuguard.exporter.errors import BackendUnavailable
from gpuguard.exporter.model import GpuSample

BACKEND_CHOICES = ("auto", "nvml", "gpusim")
NVML_FIX = (
    "on a host with an NVIDIA GPU, install its driver (NVML, libnvidia-ml.so.1, comes with it; "
    "in a container, the NVIDIA Container Toolkit mounts it)"
)


class GpuBackend(Protocol):
    """A source of GPU samples; implementations raise ``BackendError`` and nothing else."""

    name: str

    def sample(self) -> GpuSample: ...

    def close(self) -> None: ...


def open_backend(kind: str, gpusim_socket: Path, nvml_module: Any = None) -> GpuBackend:
    """Open the backend named by ``--gpu.backend``.

    ``auto`` takes NVML when it initialises, else gpusim when its socket exists; otherwise
    it raises ``BackendUnavailable`` with one line saying what was tried.
    """
    from gpuguard.exporter.backends.gpusim import GpusimBackend
    from gpuguard.exporter.backends.nvml import NvmlBackend

    if kind == "nvml":
        try:
            return NvmlBackend(nvml_module)
        except BackendUnavailable as exc:
            raise BackendUnavailable(f"--gpu.backend nvml: {exc}; {NVML_FIX}") from exc
    if kind == "gpusim":
        return GpusimBackend(_gpusim_socket(gpusim_socket))
    if kind != "auto":
        raise BackendUnavailable(f"unknown GPU backend {kind!r} (use auto, nvml or gpusim)")
    try:
        return NvmlBackend(nvml_module)
    except BackendUnavailable as nvml_exc:
        if gpusim_socket.exists():
            return GpusimBackend(_gpusim_socket(gpusim_socket))
        raise BackendUnavailable(
            f"no GPU backend: NVML failed ({nvml_exc}) and there is no gpusim socket at "
            f"{gpusim_socket}. {NVML_FIX}; without a GPU, start gpusim (`gpusim serve "
            f"--socket {gpusim_socket}`) or point --gpusim.socket at its socket "
            "(`make demo` runs everything on gpusim)"
        ) from nvml_exc


def _gpusim_socket(path: Path) -> Path:
    """``path``, unless something other than a socket is there (gpusim may start later at a
    path that does not exist yet, but nothing ever listens on a regular file)."""
    if path.exists() and not path.is_socket():
        raise BackendUnavailable(
            f"--gpusim.socket {path} is not a socket: point it at the one `gpusim serve` "
            "listens on (or $GPUSIM_SOCKET)"
        )
    return path
