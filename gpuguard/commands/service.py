"""What the commands that talk to a gpuguard service share: its URL flag's type."""

from __future__ import annotations

import argparse

from gpuguard import flags


def service_url(text: str) -> str:
    """An argparse type: an http(s) URL without its trailing slash; else one line."""
    try:
        return flags.http_url({"url": text}, "url", ("http", "https"))
    except flags.ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL") from None
