"""The HTTP server core shared by gpuguard's services (exporter, actuator, placer).

``routes`` is pure: requests, responses, a router with per-route auth and body limits, and
the helpers that shape a reply (gzip, landing page, strict parameter parsing). ``server``
runs a router on one asyncio loop with h11 doing the HTTP/1.1 framing: caps, timeouts,
token-before-body and keep-alive live there, once, for every service.

A service in a few lines (handlers take a ``Request`` and return a ``Response``; plain
ones run in the server's thread pool, ``async`` ones on its loop)::

    router = Router(token)                      # None: no token anywhere (loopback only)
    router.get("/api/v1/nodes", list_nodes, compress=True)
    router.post("/api/v1/place", place, max_body=64 * 1024)  # token required by default
    server = HttpServer(("127.0.0.1", port), router, name="gpuguard-placer")  # binds now
    server.serve_in_thread()
    ...
    server.shutdown()
    server.server_close()

Handlers raise ``HttpError(status, message)`` for a 4xx; anything else they raise is a 500.
"""

from gpuguard.web.routes import HttpError, Request, Response, Router
from gpuguard.web.server import HttpServer, Limits

__all__ = ["HttpError", "HttpServer", "Limits", "Request", "Response", "Router"]
