"""A stand-in for the Kubernetes API server's node endpoints, on loopback, that checks
every request against the API: no API server can run where the tests run.

It serves ``GET`` and ``PUT`` ``/api/v1/nodes/{name}`` and nothing else. Every request's
method and path must be one of those; a ``PUT`` must be JSON whose body is a valid ``Node``
by the API's schema (the official client's generated ``V1Node`` model: required fields, value
types) with no field the schema lacks (it must survive the model's round trip unchanged),
for the node in the path, carrying the ``resourceVersion`` last served (else 409, as the API
server answers a stale update). Anything else is recorded in ``violations`` and refused.
"""

from __future__ import annotations

import json
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_NODE_PATH = re.compile(r"^/api/v1/nodes/([a-z0-9]([-a-z0-9.]*[a-z0-9])?)$")


def schema_problem(body: Any) -> str | None:
    """Why ``body`` is not a valid Node by the API's schema, or None."""
    from kubernetes.client import ApiClient, V1Node

    if not isinstance(body, dict):
        return "not an object"
    try:
        model = V1Node.from_dict(body)
    except Exception as exc:  # pydantic's ValidationError: the schema refused it
        return f"invalid Node: {exc}"
    if ApiClient().sanitize_for_serialization(model) != body:
        return "fields the Node schema does not have"
    if body.get("apiVersion") != "v1" or body.get("kind") != "Node":
        return "apiVersion/kind must be v1/Node"
    return None


class KubeStandIn:
    """Nodes by name (the API's JSON), served on 127.0.0.1 until ``stop``."""

    def __init__(self, nodes: dict[str, dict[str, Any]]) -> None:
        self.nodes = nodes
        self.requests: list[tuple[str, str]] = []
        self.violations: list[str] = []
        #: answer this many updates 409 after a change by "someone else" (a version bump)
        self.conflicts = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> KubeStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _refuse(self, status: int, why: str) -> None:
                stand_in.violations.append(f"{self.command} {self.path}: {why}")
                self._reply(status, _status(status, why))

            def _node(self) -> str | None:
                match = _NODE_PATH.match(self.path)
                return match.group(1) if match else None

            def do_GET(self) -> None:
                stand_in.requests.append(("GET", self.path))
                name = self._node()
                if name is None:
                    return self._refuse(HTTPStatus.NOT_FOUND, "not a node path")
                with stand_in._lock:
                    node = stand_in.nodes.get(name)
                if node is None:
                    return self._reply(HTTPStatus.NOT_FOUND, _status(404, f"node {name}"))
                return self._reply(HTTPStatus.OK, node)

            def do_PUT(self) -> None:
                stand_in.requests.append(("PUT", self.path))
                name = self._node()
                if name is None:
                    return self._refuse(HTTPStatus.NOT_FOUND, "not a node path")
                if self.headers.get("Content-Type", "").split(";")[0] != "application/json":
                    return self._refuse(
                        HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                        f"not JSON: {self.headers.get('Content-Type')}",
                    )
                try:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                except (ValueError, TypeError, KeyError):
                    return self._refuse(HTTPStatus.BAD_REQUEST, "unreadable body")
                problem = schema_problem(body)
                if problem is None and (body.get("metadata") or {}).get("name") != name:
                    problem = "metadata.name is not the node in the path"
                if problem is not None:
                    return self._refuse(HTTPStatus.UNPROCESSABLE_ENTITY, problem)
                with stand_in._lock:
                    current = stand_in.nodes.get(name)
                    if current is None:
                        return self._reply(HTTPStatus.NOT_FOUND, _status(404, f"node {name}"))
                    version = int(current["metadata"]["resourceVersion"])
                    if stand_in.conflicts > 0:  # someone else wrote first
                        stand_in.conflicts -= 1
                        version += 1
                        current["metadata"]["resourceVersion"] = str(version)
                    if body["metadata"].get("resourceVersion") != str(version):
                        return self._reply(HTTPStatus.CONFLICT, _status(409, "stale"))
                    body["metadata"]["resourceVersion"] = str(version + 1)
                    stand_in.nodes[name] = body
                return self._reply(HTTPStatus.OK, body)

            def _unsupported(self) -> None:
                stand_in.requests.append((self.command, self.path))
                self._refuse(HTTPStatus.METHOD_NOT_ALLOWED, "method not used by gpuguard")

            do_POST = do_PATCH = do_DELETE = _unsupported

        return Handler


def _status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "code": code}  # fmt: skip


def node(name: str, labels: dict[str, str] | None = None,
         taints: list[dict[str, str]] | None = None) -> dict[str, Any]:  # fmt: skip
    """A Node as the API serves it (the fields the marker reads and writes back)."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "100", "labels": labels or {}},
        "spec": {"podCIDR": "10.244.0.0/24"},
    }
    if taints:
        doc["spec"]["taints"] = taints
    return doc
