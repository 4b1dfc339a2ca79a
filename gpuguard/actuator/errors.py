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


class EngineError(ActuatorError):
    """A container engine (Docker, containerd) call that did not do what was asked; each
    engine adapter (``gpuguard/actuator/engine/``) translates its library's errors into these."""


class EngineDown(EngineError):
    """The engine could not be reached, or did not answer: worth a retry (HTTP 503).

    ``hung``: it took the request and never answered within its timeout; asking a hung
    engine again only multiplies the wait, so it is not retried at once.
    """

    def __init__(self, message: str, hung: bool = False) -> None:
        super().__init__(message)
        self.hung = hung


class EngineRefused(EngineError):
    """The engine answered, and did not do it."""


class ContainerGone(EngineRefused):
    """No such container (any more): a vanished container is a skip, never a failure."""


class EngineConflict(EngineRefused):
    """The container is not in the state the call needs (Docker's 409, a containerd task in
    another state): it changed meanwhile, so look at it again to say how it stands."""
