"""The commands' exceptions. A bad flag is ``gpuguard.flags.ConfigError`` (exit status 2)."""

from __future__ import annotations


class CommandError(Exception):
    """Base class of every error a command raises on purpose."""


class PlacementFailed(CommandError):
    """``gpuguard run`` could not place the service; the message is one line."""


class ServiceUnreachable(CommandError):
    """A gpuguard service did not answer (or something else did); the message says the fix."""
