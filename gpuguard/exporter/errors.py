"""The exporter's exceptions; library errors are translated into these at each boundary."""

from __future__ import annotations

from gpuguard import flags


class ExporterError(Exception):
    """Base class of every error the exporter raises on purpose."""


class ConfigError(ExporterError, flags.ConfigError):
    """The configuration (flags or YAML file) is invalid; the message is one clear line."""


class BackendError(ExporterError):
    """A GPU backend (NVML, gpusim) could not produce a sample."""


class BackendUnavailable(BackendError):
    """A GPU backend cannot be used at all on this machine (no driver, no socket)."""


class ProcfsError(ExporterError):
    """The procfs tree (``--path.procfs``) cannot be read."""
