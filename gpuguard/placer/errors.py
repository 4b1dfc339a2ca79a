"""The placer's exception hierarchy; library errors are translated at the boundary."""

from __future__ import annotations

from gpuguard import flags


class PlacerError(Exception):
    """Base class of every error the placer raises on purpose."""


class ConfigError(PlacerError, flags.ConfigError):
    """The configuration cannot be used; the message is one line for stderr."""


class BadRequest(PlacerError):
    """A placement query that breaks the API's rules (HTTP 400)."""


class RecordsUnavailable(PlacerError):
    """Prometheus could not be reached or answered with an error (HTTP 503)."""
