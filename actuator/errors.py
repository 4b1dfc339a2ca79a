"""The actuator's exception hierarchy; library errors are translated at the boundary."""

from __future__ import annotations

from gpuguard import flags

# The exporter's documents are read by the shared reader, whose error this is (also
# ``gpuguard ps``'s); the actuator catches it as its own.
from gpuguard.statedoc import StateError as StateError


class ActuatorError(Exception):
    """Base class of every error the actuator raises on purpose (but ``StateError``)."""


class ConfigError(ActuatorError, flags.ConfigError):
    """The configuration cannot be used; the message is one line for stderr."""


class PayloadError(ActuatorError):
    """An Alertmanager webhook payload that does not follow the contract (HTTP 400)."""


class ExporterUnavailable(ActuatorError):
    """The exporter could not be reached or answered with an error."""


class DockerUnavailable(ActuatorError):
    """The Docker engine could not be reached: worth a retry (HTTP 503)."""
