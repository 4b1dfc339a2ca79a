"""HTTP for the placer on gpuguard's server core (``gpuguard/web``).

Routes: ``GET /api/v1/placement`` (where a container would go: reserves nothing) and
``GET /api/v1/nodes`` (the bearer token when ``--web.token-file`` is set, checked from the
request head); ``POST /api/v1/placement`` (the same, reserved: always needs the token, so a
placer without ``--web.token-file`` refuses it with 403; rate-limited per credential, 429
with ``Retry-After``); ``GET /`` (landing page), ``GET /healthz``, ``GET /metrics``. With
``--extender.enabled``, kube-scheduler's verbs ``POST /api/v1/extender/filter`` and
``/prioritize`` (``extender``): never the token, which kube-scheduler cannot send; beyond
loopback the config insists on verified client certificates instead (``config``).
Everything the API decides lives in ``service`` and ``extender``; this module only maps
paths to their handlers and counts what the server answered on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST

from gpuguard import __version__
from gpuguard.placer import extender
from gpuguard.placer.extender import Answer, Extender
from gpuguard.placer.query import MAX_QUERY
from gpuguard.placer.service import Placer, Reply
from gpuguard.web import HttpServer, Request, Response, Router
from gpuguard.web.render import SharedRender, metrics_text
from gpuguard.web.routes import JSON, json_response, landing_page, text_response
from gpuguard.web.webconfig import WebConfigWatcher


def placer_router(
    placer: Placer,
    token: str | None,
    web_authenticates: bool = False,
    with_extender: bool = False,
) -> Router:
    """``web_authenticates``: the web config admits only clients it authenticated (basic
    auth or verified certificates), which then may reserve without a token.
    ``with_extender``: serve kube-scheduler's extender verbs too."""
    router = Router(token)
    links = [
        (
            "/api/v1/placement",
            "where a new real-time container goes (?deadline=&memory=; "
            "POST with the token to reserve it)",
        ),
        ("/api/v1/nodes", "the ranked node list"),
        ("/healthz", "health"),
        ("/metrics", "Prometheus metrics"),
    ]
    if with_extender:
        _extender_routes(router, placer)
        links.insert(2, (extender.PATH_PREFIX, "kube-scheduler extender: POST filter, prioritize"))
    page = landing_page("gpuguard placer", __version__, links)
    for path, endpoint, handle in (
        ("/api/v1/placement", "placement", placer.placement),
        ("/api/v1/nodes", "nodes", placer.nodes),
    ):
        router.get(
            path,
            _json(handle),
            auth=token is not None,
            compress=True,
            # the handler counts its own answers; count those the server gave (401, 408, ...)
            observe=_count_refusals(placer, endpoint),
        )
    router.post(
        "/api/v1/placement",
        _reserve(placer, token is not None or web_authenticates),
        auth=True,
        content_types=(FORM,),
        max_body=MAX_QUERY,
        observe=_count_refusals(placer, "reservation"),
    )
    metrics = SharedRender(lambda: metrics_text(placer.metrics.registry))
    router.get("/", lambda request: page)
    router.get("/healthz", lambda request: text_response("ok\n"))
    router.get(
        "/metrics", lambda request: Response(200, metrics.get(), CONTENT_TYPE_LATEST), compress=True
    )
    return router


FORM = "application/x-www-form-urlencoded"
NO_TOKEN = (
    "reservations need the placer's token: start it with --web.token-file (a query, "
    "GET /api/v1/placement, needs none on loopback)"
)


def _extender_routes(router: Router, placer: Placer) -> None:
    """kube-scheduler's verbs: JSON ``ExtenderArgs`` up to ``extender.MAX_BODY`` bytes, no
    token (kube-scheduler sends no Authorization header; client certificates, checked in the
    TLS handshake, authenticate it beyond loopback)."""
    verbs = Extender(placer)
    for verb, handle in (
        (extender.FILTER_VERB, verbs.filter),
        (extender.PRIORITIZE_VERB, verbs.prioritize),
    ):
        router.post(
            f"{extender.PATH_PREFIX}/{verb}",
            _extender_answer(handle),
            auth=False,
            content_types=(JSON,),
            max_body=extender.MAX_BODY,
            observe=_count_refusals(placer, f"extender_{verb}"),
        )


def _extender_answer(handle: Callable[[bytes], Answer]) -> Callable[[Request], Response]:
    def answer(request: Request) -> Response:
        reply = handle(request.body)
        return json_response(reply.doc, reply.code)

    return answer


def _json(handle: Callable[[str], Reply]) -> Callable[[Request], Response]:
    def answer(request: Request) -> Response:
        reply = handle(request.query)
        return json_response(reply.doc, reply.code)

    return answer


def _reserve(placer: Placer, authenticated: bool) -> Callable[[Request], Response]:
    """POST: the form body holds what the query string holds for GET; only a caller the
    token (or the web config) authenticated may reserve."""

    def answer(request: Request) -> Response:
        if not authenticated:
            reply = placer.refuse_reservation(NO_TOKEN)
        else:
            try:
                body = request.body.decode("ascii")
            except UnicodeDecodeError:
                body = "\x00"  # parse_query answers 400: the query must be ASCII
            # a token holder or a user is one budget however many addresses it comes from
            reply = placer.reserve(body, request.credential or request.peer)
        response = json_response(reply.doc, reply.code)
        if reply.retry_after_s is not None:
            retry = (("Retry-After", str(max(1, math.ceil(reply.retry_after_s)))),)
            response = Response(response.status, response.body, response.content_type, retry)
        return response

    return answer


def _count_refusals(placer: Placer, endpoint: str) -> Callable[[int], None]:
    def observe(code: int) -> None:
        if code in (401, 408, 413, 415, 431):  # answered before the handler ran
            placer.metrics.requests.labels(endpoint, str(code)).inc()

    return observe


def placer_server(
    address: tuple[str, int],
    placer: Placer,
    token: str | None,
    web: WebConfigWatcher | None = None,
    with_extender: bool = False,
) -> HttpServer:
    """The placer's server, bound (raises OSError when the address is taken). A web config
    that authenticates clients lets them reserve without the token; the server then refuses
    a reload that would drop that authentication (``require_auth``)."""
    authenticates = web is not None and web.current().authenticates
    router = placer_router(placer, token, authenticates, with_extender)
    return HttpServer(address, router, name="gpuguard-placer", web=web)
