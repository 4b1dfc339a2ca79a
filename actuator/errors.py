"""The actuator's exception hierarchy; library errors are translated at the boundary."""

from __future__ import annotations

from gpuguard import flags


class ActuatorError(Exception):
    """Base class of every error the actuator raises on purpose."""


class ConfigError(ActuatorError, flags.ConfigError):
    """The configuration cannot be used; the message is one line for stderr."""


class PayloadError(ActuatorError):
    """An Alertmanager webhook payload that does not follow the contract (HTTP 400)."""


class StateError(ActuatorError):
    """The exporter's state document does not follow docs/interfaces.md section 3."""


class ExporterUnavailable(ActuatorError):
    """The exporter could not be reached or answered with an error."""


class DockerUnavailable(ActuatorError):
    """The Docker engine could not be reached: worth a retry (HTTP 503)."""
