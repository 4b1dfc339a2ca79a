"""The user's commands with nothing (or the wrong thing) at a service's URL: one line that
says which service, where, what happened and what to do; exit status 1; no traceback."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.cli import main


@pytest.fixture
def closed_url() -> str:
    """A loopback URL where nothing listens (a port just bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200
    body = b"<html>not gpuguard</html>"

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(argv)
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    return status, err


PLACED_RUN = ["run", "--deadline", "9s", "--memory", "1GiB"]
COMMANDS = {
    "ps": (["ps", "--exporter.url"], "exporter", "--exporter.url (or $GPUGUARD_EXPORTER_URL)"),
    "nodes": (["nodes", "--actuator.url"], "actuator", "--actuator.url"),
    "nodes ranked": (["nodes", "--placer.url"], "placer", "--placer.url"),
    "run placed": ([*PLACED_RUN, "--placer.url"], "placer", "--placer.url"),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_nothing_listening_names_the_service_and_the_fix(
    command: str, closed_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv, service, flag = COMMANDS[command]
    extra = []
    if command == "run placed":  # with a token: a reservation (POST); without, a note first
        token = tmp_path / "token"
        token.write_text("s3cret\n")
        extra = ["--placer.token-file", str(token), "img"]
    status, err = _run([*argv, closed_url, *extra], capsys)
    assert status == 1
    assert f"no {service} at {closed_url} (connection refused): " in err
    assert f"start `gpuguard {service}`, or point {flag}" in err
    assert "HTTPConnectionPool" not in err and "Max retries" not in err


def test_something_else_at_the_url_is_said(
    server: tuple[str, type[_Handler]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = server
    status, err = _run(["nodes", "--actuator.url", url], capsys)
    assert status == 1
    assert "answered 200 without JSON: is that the actuator?" in err


def test_a_service_error_is_its_own_reason(
    server: tuple[str, type[_Handler]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, handler = server
    handler.status, handler.body = 503, b'{"error": "no poll finished yet"}'
    status, err = _run(["ps", "--exporter.url", url], capsys)
    assert status == 1
    assert err == "gpuguard ps: the exporter answered 503 no poll finished yet\n"


def test_a_state_ps_cannot_read_is_one_line(
    server: tuple[str, type[_Handler]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, handler = server
    handler.body = b'{"node": "n", "seq": "1"}'
    status, err = _run(["ps", "--exporter.url", url], capsys)
    assert status == 1
    assert err == (
        "gpuguard ps: the exporter's state is not what gpuguard reads: "
        "state.seq has the wrong type (str)\n"
    )
