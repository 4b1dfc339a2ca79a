"""The HTTP server core shared by gpuguard's services (exporter, actuator, placer).

``routes`` is pure (requests, responses, a router with per-route auth and body limits,
reply helpers); ``server`` runs a router on one asyncio loop with h11, holding the caps,
timeouts, token-before-body and keep-alive once for every service. Handlers take a
``Request`` and return a ``Response`` (plain ones in a thread pool, ``async`` ones on the
loop) and raise ``HttpError(status, message)`` for a 4xx; anything else is a 500::

    router = Router(token)                      # None: no token anywhere (loopback only)
    router.get("/api/v1/nodes", list_nodes, compress=True)
    router.post("/api/v1/place", place, max_body=64 * 1024)  # token required by default
    server = HttpServer(("127.0.0.1", port), router, name="gpuguard-placer")  # binds now
    server.serve_in_thread()
"""

from gpuguard.web.routes import HttpError, Request, Response, Router
from gpuguard.web.server import HttpServer, Limits

__all__ = ["HttpError", "HttpServer", "Limits", "Request", "Response", "Router"]
