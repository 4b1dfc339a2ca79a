"""The HTTP server core shared by gpuguard's services (exporter, actuator, placer).

``routes`` is pure: requests, responses, a router with per-route auth and body limits, and
the helpers that shape a reply (gzip, landing page, strict parameter parsing). ``server``
runs a router on one asyncio loop with h11 doing the HTTP/1.1 framing: caps, timeouts,
token-before-body and keep-alive live there, once, for every service.
"""

from gpuguard.web.routes import HttpError, Request, Response, Router
from gpuguard.web.server import HttpServer, Limits

__all__ = ["HttpError", "HttpServer", "Limits", "Request", "Response", "Router"]
