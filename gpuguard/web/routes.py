"""Requests, responses and routes of gpuguard's HTTP servers (pure: no I/O).

A service builds a ``Router``, registers its endpoints with ``get``/``post`` and hands it
to ``HttpServer``. Per route it says who may call it (``auth``: the bearer token, checked
from the request head before any body is read), which content types and how many body bytes
it takes, whether replies may be gzipped, and whether a long poll may be cut short when the
server needs its connection back (``interruptible``).
"""

from __future__ import annotations

import asyncio
import gzip
import hmac
import html
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"
GZIP_LEVEL = 1  # loopback and LAN: speed over the last few percent of size
DEFAULT_MAX_BODY = 1024 * 1024


class HttpError(Exception):
    """Answer ``status`` with ``{"error": message}``; raised by handlers or the server."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


@dataclass(slots=True)
class Request:
    """One request as a handler sees it; header names are lower case."""

    method: str
    path: str
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: resolved by the server when it needs this connection back (interruptible routes)
    interrupt: asyncio.Future[None] | None = None
    #: the client's address (IP, without the port)
    peer: str = ""
    #: who the request proved to be, for per-credential limits: ``the bearer token``,
    #: ``user NAME`` (basic auth) or ``certificate NAME`` (a verified client certificate's
    #: common name, else its first SAN); empty when it proved nothing
    credential: str = ""

    @property
    def accepts_gzip(self) -> bool:
        return accepts_gzip(self.headers.get("accept-encoding"))


@dataclass(frozen=True, slots=True)
class Response:
    """A whole reply. ``gzipped`` is the body already compressed (e.g. a cached render)."""

    status: int
    body: bytes = b""
    content_type: str = TEXT
    headers: tuple[tuple[str, str], ...] = ()
    gzipped: bytes | None = None


Handler = Callable[[Request], Response] | Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    auth: bool = False
    content_types: frozenset[str] = frozenset()
    max_body: int = 0
    compress: bool = False
    interruptible: bool = False
    #: told the status of every answer on this route, those the server decides included
    observe: Callable[[int], None] | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.handler)


class Router:
    """Exact-path routes; ``token`` (None: no auth anywhere) guards routes with ``auth``."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self._routes: dict[str, dict[str, Route]] = {}

    def get(
        self,
        path: str,
        handler: Handler,
        *,
        auth: bool = False,
        compress: bool = False,
        interruptible: bool = False,
        observe: Callable[[int], None] | None = None,
    ) -> None:
        """A GET (and HEAD) endpoint; it takes no request body."""
        if interruptible and not inspect.iscoroutinefunction(handler):
            raise ValueError(f"{path}: only an async handler can be interruptible")
        route = Route("GET", path, handler, auth, frozenset(), 0, compress, interruptible, observe)
        self._add(route)

    def post(
        self,
        path: str,
        handler: Handler,
        *,
        auth: bool = True,
        content_types: tuple[str, ...] = (JSON,),
        max_body: int = DEFAULT_MAX_BODY,
        compress: bool = False,
        observe: Callable[[int], None] | None = None,
    ) -> None:
        """A POST endpoint; by default it needs the token and takes JSON up to 1 MiB."""
        types = frozenset(t.lower() for t in content_types)
        self._add(Route("POST", path, handler, auth, types, max_body, compress, False, observe))

    def _add(self, route: Route) -> None:
        if not route.path.startswith("/"):
            raise ValueError(f"route path must start with '/': {route.path!r}")
        self._routes.setdefault(route.path, {})[route.method] = route

    def resolve(self, method: str, path: str) -> Route:
        """The route for a request; ``HttpError`` 404 or 405 when there is none."""
        by_method = self._routes.get(path)
        if by_method is None:
            raise HttpError(404, f"no such path {path}")
        route = by_method.get("GET" if method == "HEAD" else method)
        if route is None:
            allowed = ", ".join(sorted({*by_method, *(["HEAD"] if "GET" in by_method else [])}))
            raise HttpError(405, f"{method} not allowed on {path}", (("Allow", allowed),))
        return route

    def authorized(self, headers: Mapping[str, str]) -> bool:
        return self.token is None or bearer_matches(headers.get("authorization"), self.token)

    def paths(self) -> list[str]:
        return sorted(self._routes)


def bearer_matches(header: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def accepts_gzip(header: str | None) -> bool:
    """Whether an ``Accept-Encoding`` value allows gzip (``gzip`` or ``*`` with q > 0)."""
    allowed: dict[str, bool] = {}
    for item in (header or "").split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if coding:
            allowed[coding.lower()] = q > 0
    return allowed.get("gzip", allowed.get("x-gzip", allowed.get("*", False)))


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(doc, separators=(",", ":")).encode() + b"\n", JSON)


def text_response(text: str, status: int = 200) -> Response:
    return Response(status, text.encode(), TEXT)


def error_response(exc: HttpError) -> Response:
    return Response(exc.status, json_response({"error": exc.message}).body, JSON, exc.headers)


def compressed(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)


def encode(response: Response, route: Route | None, request: Request | None) -> Response:
    """Apply content coding: gzip when the route allows it and the client asked."""
    if route is None or not route.compress or request is None or not request.accepts_gzip:
        return response
    body = response.gzipped if response.gzipped is not None else compressed(response.body)
    headers = (*response.headers, ("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding"))
    return Response(response.status, body, response.content_type, headers)


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def landing_page(title: str, version: str, links: list[tuple[str, str]]) -> Response:
    """The page at ``/``: what this is and where its endpoints are."""
    items = "\n".join(
        f'<li><a href="{html.escape(path)}">{html.escape(path)}</a> {html.escape(text)}</li>'
        for path, text in links
    )
    page = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title></head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n<p>gpuguard {html.escape(version)}</p>\n"
        f"<ul>\n{items}\n</ul>\n</body></html>\n"
    )
    return Response(200, page.encode(), HTML)
