"""What the commands that talk to a gpuguard service share: its URL flags, and one GET that
turns every way of not reaching the service into one line saying what to do."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuguard import flags
from gpuguard.commands.errors import ServiceUnreachable
from gpuguard.web import client
from gpuguard.web.client import ClientConfig


@dataclass(frozen=True)
class Service:
    """A service a command asks: what it is called, how it starts, how to point at it."""

    name: str
    flag: str
    env: str | None = None

    def fix(self) -> str:
        where = f"{self.flag} (or ${self.env})" if self.env else self.flag
        demo = "; for the demo's, `. .stack/env`" if self.env else ""
        return f"start `gpuguard {self.name}`, or point {where} at one{demo}"


EXPORTER = Service("exporter", "--exporter.url", "GPUGUARD_EXPORTER_URL")
ACTUATOR = Service("actuator", "--actuator.url", "GPUGUARD_ACTUATOR_URL")
PLACER = Service("placer", "--placer.url")


@dataclass(frozen=True)
class Reply:
    status: int
    doc: Any

    def error(self) -> str:
        """The service's own one-line reason (``{"error": ...}``), else the status."""
        if isinstance(self.doc, dict) and self.doc.get("error"):
            return f"{self.status} {self.doc['error']}"
        return str(self.status)


def service_url(text: str) -> str:
    """An argparse type: an http(s) URL without its trailing slash; else one line."""
    try:
        return flags.http_url({"url": text}, "url", ("http", "https"))
    except flags.ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL") from None


def add_service_flags(parser: argparse.ArgumentParser, service: Service, default: str) -> None:
    """``--NAME.url`` (default: ``$ENV``, else ``default``) and ``--NAME.http-config-file``
    for a service a command always asks (one with an environment variable)."""
    if service.env is None:
        raise ValueError(f"the {service.name} has no environment variable for its URL")
    parser.add_argument(
        service.flag,
        dest=f"{service.name}_url",
        type=service_url,
        metavar="URL",
        default=os.environ.get(service.env, default),
        help=f"the {service.name} (default: ${service.env} or %(default)s)",
    )
    add_http_config_flag(parser, service.name)


def add_http_config_flag(parser: argparse.ArgumentParser, name: str) -> None:
    """``--NAME.http-config-file``: TLS and basic auth for ``--NAME.url`` (an https server
    behind ``--web.config.file``), in Prometheus' http_config format."""
    parser.add_argument(
        f"--{name}.http-config-file",
        dest=f"{name}_http_config_file",
        metavar="PATH",
        default=None,
        help=client.flag_help(f"--{name}.url"),
    )


def http_config(path: str | None, name: str) -> ClientConfig:
    """The client config ``--NAME.http-config-file`` names; ``flags.ConfigError`` if bad."""
    return client.load_client_config(path, f"{name}.http-config-file")


def get_json(
    service: Service,
    base_url: str,
    path: str,
    params: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 5.0,
    tls_auth: ClientConfig = client.NONE,
) -> Reply:
    """GET ``base_url + path`` as JSON, whatever its status; ``ServiceUnreachable`` (one line
    with the fix) when nothing answers there, or something that is not the service."""
    return call_json(service, "GET", base_url, path, params, headers, timeout_s, tls_auth)


def call_json(
    service: Service,
    method: str,
    base_url: str,
    path: str,
    params: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 5.0,
    tls_auth: ClientConfig = client.NONE,
) -> Reply:
    """``get_json`` for any method; a POST sends ``params`` as a form."""
    import requests

    url = base_url.rstrip("/") + path
    query, form = (params, None) if method == "GET" else (None, params)
    try:
        with tls_auth.session() as session:
            reply = session.request(
                method, url, params=query, data=form, headers=headers, timeout=timeout_s
            )
    except requests.RequestException as exc:
        raise ServiceUnreachable(
            f"no {service.name} at {base_url} ({_why(exc, timeout_s)}): {service.fix()}"
        ) from None
    try:
        return Reply(reply.status_code, reply.json())
    except ValueError:
        raise ServiceUnreachable(
            f"{url} answered {reply.status_code} without JSON: is that the {service.name}? "
            f"({service.fix()})"
        ) from None


def _why(exc: Exception, timeout_s: float) -> str:
    """What went wrong, in words: the cause requests wraps, not its repr."""
    import requests

    if isinstance(exc, requests.Timeout):
        return f"no answer within {timeout_s:g}s"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()
        cause = cause.__cause__ or cause.__context__
    return type(exc).__name__
