"""The pure parts of the HTTP server core: routing, auth, gzip negotiation, strict numbers."""

from __future__ import annotations

import gzip
import json

import pytest

from gpuguard.labels import LabelError, ascii_int, parse_gpu
from gpuguard.web.routes import (
    HttpError,
    Request,
    Response,
    Router,
    accepts_gzip,
    bearer_matches,
    encode,
    landing_page,
)
from gpuguard.web.server import Limits, connection_cap


def ok(request: Request) -> Response:
    return Response(200, b"ok")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, False),
        ("", False),
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("deflate;q=1.0, GZIP;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip;q=0.0, *;q=1", False),
        ("*", True),
        ("identity", False),
        ("x-gzip", True),
        ("gzip;q=nonsense", False),
    ],
)
def test_accepts_gzip(header: str | None, expected: bool) -> None:
    assert accepts_gzip(header) is expected


def test_bearer_token() -> None:
    assert bearer_matches("Bearer s3cret", "s3cret")
    assert bearer_matches("bearer  s3cret ", "s3cret")
    assert not bearer_matches("Basic s3cret", "s3cret")
    assert not bearer_matches("Bearer s3cre", "s3cret")
    assert not bearer_matches(None, "s3cret")


def test_router_resolves_exact_paths_with_404_and_405() -> None:
    router = Router()
    router.get("/metrics", ok)
    router.post("/api/v1/alerts", ok)
    assert router.resolve("GET", "/metrics").path == "/metrics"
    assert router.resolve("HEAD", "/metrics").method == "GET"
    with pytest.raises(HttpError) as missing:
        router.resolve("GET", "/metrics/")
    assert missing.value.status == 404
    with pytest.raises(HttpError) as wrong:
        router.resolve("POST", "/metrics")
    assert wrong.value.status == 405 and ("Allow", "GET, HEAD") in wrong.value.headers
    with pytest.raises(HttpError) as get_post:
        router.resolve("GET", "/api/v1/alerts")
    assert ("Allow", "POST") in get_post.value.headers


def test_post_routes_need_the_token_by_default_get_routes_do_not() -> None:
    router = Router(token="t")
    router.get("/open", ok)
    router.post("/closed", ok)
    assert not router.resolve("GET", "/open").auth
    route = router.resolve("POST", "/closed")
    assert route.auth and route.content_types == {"application/json"} and route.max_body > 0
    assert router.authorized({"authorization": "Bearer t"})
    assert not router.authorized({})
    assert Router(token=None).authorized({})  # insecure mode: nothing to check


def test_only_async_handlers_may_be_interruptible() -> None:
    async def poll(request: Request) -> Response:
        return Response(200)

    router = Router()
    router.get("/poll", poll, interruptible=True)
    assert router.resolve("GET", "/poll").is_async
    with pytest.raises(ValueError):
        router.get("/sync", ok, interruptible=True)


def test_encode_gzips_only_when_route_and_client_agree() -> None:
    router = Router()
    router.get("/z", ok, compress=True)
    router.get("/plain", ok)
    body = b"x" * 1000
    asked = Request("GET", "/z", headers={"accept-encoding": "gzip"})
    zipped = encode(Response(200, body), router.resolve("GET", "/z"), asked)
    assert gzip.decompress(zipped.body) == body
    assert ("Content-Encoding", "gzip") in zipped.headers
    assert ("Vary", "Accept-Encoding") in zipped.headers
    plain = encode(Response(200, body), router.resolve("GET", "/plain"), asked)
    assert plain.body == body and not plain.headers
    not_asked = encode(Response(200, body), router.resolve("GET", "/z"), Request("GET", "/z"))
    assert not_asked.body == body
    cached = encode(Response(200, body, gzipped=b"pre"), router.resolve("GET", "/z"), asked)
    assert cached.body == b"pre"


def test_landing_page_links_and_escapes() -> None:
    page = landing_page("a <b>", "1.0", [("/metrics", "metrics & more")]).body.decode()
    assert '<a href="/metrics">/metrics</a>' in page
    assert "a &lt;b&gt;" in page and "metrics &amp; more" in page


@pytest.mark.parametrize("text", ["²", "٣", "-1", "1.0", " 1", "", "1" * 20, "0x1"])
def test_ascii_int_refuses_what_int_would_take_or_choke_on(text: str) -> None:
    with pytest.raises(LabelError):
        ascii_int(text, 19)


def test_ascii_int_bounds_length_before_converting() -> None:
    assert ascii_int("0" * 19, 19) == 0
    with pytest.raises(LabelError):
        ascii_int("9" * 5000, 19)  # int() itself raises past 4,300 digits


@pytest.mark.parametrize(("text", "index"), [("0", 0), ("7", 7), ("1:2", 1), ("003", 3)])
def test_parse_gpu(text: str, index: int) -> None:
    assert parse_gpu(text) == index


@pytest.mark.parametrize("text", ["²", "1" * 5000, "GPU-abc", "0:", ":1", "0:1:2", "", "1 "])
def test_parse_gpu_refuses(text: str) -> None:
    with pytest.raises(LabelError):
        parse_gpu(text)


def test_connection_cap_stays_below_the_file_limit() -> None:
    limits = Limits(max_connections=4096, fd_reserve=64)
    assert connection_cap(limits, 65536) == 4096
    assert connection_cap(limits, 1024) == 960
    assert connection_cap(limits, 10) == 16  # never zero


def test_error_bodies_are_json() -> None:
    from gpuguard.web.routes import error_response

    reply = error_response(HttpError(418, "teapot", (("X", "y"),)))
    assert reply.status == 418 and json.loads(reply.body) == {"error": "teapot"}
    assert reply.headers == (("X", "y"),)


def test_shared_render_serves_concurrent_callers_from_one_render() -> None:
    import threading
    import time

    from gpuguard.web.render import SharedRender

    started, release = threading.Event(), threading.Event()
    renders: list[int] = []

    def render() -> bytes:
        renders.append(1)
        started.set()
        release.wait(5)
        return b"body %d" % len(renders)

    shared = SharedRender(render)
    results: list[bytes] = []
    callers = [threading.Thread(target=lambda: results.append(shared.get())) for _ in range(8)]
    callers[0].start()
    assert started.wait(5)
    for caller in callers[1:]:
        caller.start()
    time.sleep(0.5)  # the others are waiting on the first render
    release.set()
    for caller in callers:
        caller.join(5)
    assert results == [b"body 1"] * 8 and len(renders) == 1
    assert shared.get() == b"body 2"  # nothing kept: the next caller renders afresh


def test_shared_render_failure_reaches_every_caller() -> None:
    from gpuguard.web.render import SharedRender

    def render() -> bytes:
        raise OSError("registry unreadable")

    with pytest.raises(OSError):
        SharedRender(render).get()
