"""The shared server core behind a web config, over real TLS on 127.0.0.1: certificates,
client certificates, basic auth before the body, the token beside it, and reload."""

from __future__ import annotations

import re
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from gpuguard.cli import main
from gpuguard.web import HttpServer, Limits, Request, Response, Router
from gpuguard.web.routes import json_response
from gpuguard.web.webconfig import WebConfigWatcher, load_web_config
from tests.support.tlscerts import Pki, write_web_config

TOKEN = "tok-for-tests"


def serve(config: Path, limits: Limits | None = None) -> HttpServer:
    router = Router(TOKEN)
    seen: list[bytes] = []
    router.get("/hello", lambda request: Response(200, b"hello\n"))
    router.get("/api/v1/nodes", lambda request: json_response({"nodes": [], "tls": True}))

    def post(request: Request) -> Response:
        seen.append(request.body)
        return Response(200, b"ok\n")

    router.post("/post", post)
    watcher = WebConfigWatcher(load_web_config(config), check_every_s=0.0)
    server = HttpServer(("127.0.0.1", 0), router, limits, name="tls-test", web=watcher)
    server.serve_in_thread()
    return server


@pytest.fixture
def started() -> Iterator[list[HttpServer]]:
    servers: list[HttpServer] = []
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def exposition(watcher: WebConfigWatcher) -> str:
    """What ``/metrics`` shows of the web config: ``WebConfigCollector`` rendered."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuguard.web.webconfig import WebConfigCollector

    registry = CollectorRegistry()
    registry.register(WebConfigCollector(watcher))
    return generate_latest(registry).decode()


def url(server: HttpServer, path: str = "/hello") -> str:
    return f"https://127.0.0.1:{server.server_address[1]}{path}"


def test_tls_and_basic_auth(pki: Pki, tmp_path: Path, started: list[HttpServer]) -> None:
    config = write_web_config(
        tmp_path / "web.yml", pki, {"prometheus": "right"}, headers={"X-Frame-Options": "deny"}
    )
    server = serve(config)
    started.append(server)
    ok = requests.get(url(server), verify=str(pki.ca), auth=("prometheus", "right"), timeout=10)
    assert ok.status_code == 200 and ok.text == "hello\n"
    assert ok.headers["X-Frame-Options"] == "deny"
    for auth in (None, ("prometheus", "wrong"), ("nobody", "right")):
        refused = requests.get(url(server), verify=str(pki.ca), auth=auth, timeout=10)
        assert refused.status_code == 401
        assert refused.headers["WWW-Authenticate"] == "Basic"
        assert refused.headers["X-Frame-Options"] == "deny"
    # who asks comes before what: an unknown path is a 401 too
    assert requests.get(url(server, "/nope"), verify=str(pki.ca), timeout=10).status_code == 401
    with pytest.raises(requests.exceptions.SSLError):  # the server is not who the other CA says
        requests.get(url(server), verify=str(pki.other_ca), timeout=10)
    plain = f"http://127.0.0.1:{server.server_address[1]}/hello"
    with pytest.raises(requests.ConnectionError):
        requests.get(plain, auth=("prometheus", "right"), timeout=10)


def test_bcrypt_runs_once_per_credentials(pki: Pki, tmp_path: Path, started: list) -> None:
    server = serve(write_web_config(tmp_path / "web.yml", pki, {"prometheus": "right"}))
    started.append(server)
    with requests.Session() as session:
        for _ in range(20):
            r = session.get(
                url(server), verify=str(pki.ca), auth=("prometheus", "right"), timeout=10
            )
            assert r.status_code == 200
    assert server.basic_auth.hashes == 1


def test_credentials_are_checked_before_the_body(
    pki: Pki, tmp_path: Path, started: list[HttpServer]
) -> None:
    server = serve(write_web_config(tmp_path / "web.yml", pki, {"alertmanager": "right"}))
    started.append(server)
    context = ssl.create_default_context(cafile=str(pki.ca))
    raw = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        # declares 4 MiB and sends none of it: the answer must not wait for the body
        tls.sendall(
            b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 4194304\r\n\r\n"
        )
        started_at = time.monotonic()
        head = tls.recv(4096)
    assert head.startswith(b"HTTP/1.1 401 ")
    assert time.monotonic() - started_at < 5
    # the bearer token stands in for basic auth, and basic auth for the token
    for kwargs in ({"headers": {"Authorization": f"Bearer {TOKEN}"}},
                   {"auth": ("alertmanager", "right")}):  # fmt: skip
        reply = requests.post(url(server, "/post"), json={}, verify=str(pki.ca), timeout=10,
                              **kwargs)  # type: ignore[arg-type]  # fmt: skip
        assert reply.status_code == 200, reply.text


def test_client_certificates(pki: Pki, tmp_path: Path, started: list[HttpServer]) -> None:
    config = write_web_config(tmp_path / "web.yml", pki, client_auth="RequireAndVerifyClientCert")
    server = serve(config)
    started.append(server)
    good = (str(pki.client_cert), str(pki.client_key))
    assert requests.get(url(server), verify=str(pki.ca), cert=good, timeout=10).ok
    rogue = (str(pki.rogue_cert), str(pki.rogue_key))
    for cert in (None, rogue):
        with pytest.raises(requests.ConnectionError):  # SSLError is one
            requests.get(url(server), verify=str(pki.ca), cert=cert, timeout=10)
    assert server.counters["tls_handshake_errors"] >= 1
    # and an operator sees them: /metrics counts refused TLS connections by reason
    assert server.web is not None
    text = exposition(server.web)
    refused = re.search(
        r'gpuguard_web_tls_refused_connections_total\{reason="handshake"\} (\S+)', text
    )
    assert refused is not None and float(refused.group(1)) >= 1, text


def test_client_allowed_sans(pki: Pki, tmp_path: Path, started: list[HttpServer]) -> None:
    path = write_web_config(tmp_path / "web.yml", pki, client_auth="RequireAndVerifyClientCert")
    doc = yaml.safe_load(path.read_text())
    doc["tls_server_config"]["client_allowed_sans"] = ["prometheus.test"]
    path.write_text(yaml.safe_dump(doc))
    server = serve(path)
    started.append(server)
    good = (str(pki.client_cert), str(pki.client_key))
    assert requests.get(url(server), verify=str(pki.ca), cert=good, timeout=10).ok
    doc["tls_server_config"]["client_allowed_sans"] = ["someone-else.test"]
    path.write_text(yaml.safe_dump(doc))  # reloaded: the same certificate is now refused
    deadline = time.monotonic() + 5
    while True:
        try:
            requests.get(url(server), verify=str(pki.ca), cert=good, timeout=10)
        except requests.ConnectionError:
            break
        assert time.monotonic() < deadline, "the new client_allowed_sans never applied"
        time.sleep(0.05)
    assert server.counters["tls_client_refused"] >= 1
    assert server.web is not None and server.web.tls_refused["client_san"] >= 1
    assert 'gpuguard_web_tls_refused_connections_total{reason="client_san"}' in exposition(
        server.web
    )


def test_a_stalled_handshake_holds_nobody_up(pki: Pki, tmp_path: Path, started: list) -> None:
    limits = Limits(header_timeout_s=1.0)
    server = serve(write_web_config(tmp_path / "web.yml", pki), limits)
    started.append(server)
    silent = [socket.create_connection(("127.0.0.1", server.server_address[1])) for _ in range(5)]
    try:
        started_at = time.monotonic()
        assert requests.get(url(server), verify=str(pki.ca), timeout=10).ok
        assert time.monotonic() - started_at < 1.0
        silent[0].settimeout(5)
        assert silent[0].recv(1) == b""  # closed after the handshake timeout
    finally:
        for sock in silent:
            sock.close()


def test_a_changed_password_applies_without_a_restart(
    pki: Pki, tmp_path: Path, started: list[HttpServer]
) -> None:
    path = write_web_config(tmp_path / "web.yml", pki, {"prometheus": "old"})
    server = serve(path)
    started.append(server)
    get = lambda auth: requests.get(url(server), verify=str(pki.ca), auth=auth, timeout=10)  # noqa: E731
    assert get(("prometheus", "old")).status_code == 200
    write_web_config(path, pki, {"prometheus": "new"})
    deadline = time.monotonic() + 5
    while get(("prometheus", "new")).status_code != 200:
        assert time.monotonic() < deadline, "the new password was never accepted"
        time.sleep(0.05)
    assert get(("prometheus", "old")).status_code == 401
    path.write_text("basic_auth_users: nonsense\n")  # a bad file: the last good one stays
    time.sleep(0.05)
    assert get(("prometheus", "new")).status_code == 200
    assert server.web is not None and not server.web.last_reload_successful


def test_client_config_session_verifies_with_its_ca_despite_the_environment(
    pki: Pki, tmp_path: Path, started: list[HttpServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuguard.web.client import ClientConfig

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    config = write_web_config(
        tmp_path / "web.yml", pki, {"actuator": "pw"}, client_auth="RequireAndVerifyClientCert"
    )
    server = serve(config)
    started.append(server)
    client = ClientConfig(pki.ca, pki.client_cert, pki.client_key, False, "actuator", "pw")
    with client.session() as session:
        assert session.get(url(server), timeout=10).status_code == 200
    with ClientConfig(pki.ca, pki.client_cert, pki.client_key).session() as session:
        assert session.get(url(server), timeout=10).status_code == 401


def test_gpuguard_nodes_speaks_https_with_a_client_config(
    pki: Pki, tmp_path: Path, started: list[HttpServer], capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_web_config(
        tmp_path / "web.yml", pki, {"operator": "pw"}, client_auth="RequireAndVerifyClientCert"
    )
    server = serve(config)
    started.append(server)
    base = f"https://127.0.0.1:{server.server_address[1]}"
    client = tmp_path / "client.yml"
    client.write_text(
        f"tls_config: {{ca_file: {pki.ca}, cert_file: {pki.client_cert}, "
        f"key_file: {pki.client_key}}}\nbasic_auth: {{username: operator, password: pw}}\n"
    )
    argv = ["nodes", f"--actuator.url={base}", "--json"]
    assert main([*argv, f"--actuator.http-config-file={client}"]) == 0
    assert '"tls": true' in capsys.readouterr().out
    assert main(argv) == 1  # the system's CAs do not know this server: one line, no trace
    err = capsys.readouterr().err
    assert err.startswith("gpuguard nodes: no actuator at") and err.count("\n") == 1
    client.write_text(f"tls_config: {{ca_file: {pki.ca}}}\n")  # no client certificate
    assert main([*argv, f"--actuator.http-config-file={client}"]) == 1
    client.write_text("tls_config: {ca: x}\n")
    assert main([*argv, f"--actuator.http-config-file={client}"]) == 2
    assert "--actuator.http-config-file" in capsys.readouterr().err


def test_bcrypt_waiting_is_bounded(
    tmp_path: Path, started: list[HttpServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    import bcrypt

    from gpuguard.web import server as server_module

    monkeypatch.setattr(server_module, "MAX_PENDING_BCRYPT", 1)
    slow = bcrypt.hashpw(b"right", bcrypt.gensalt(12)).decode()  # about 0.25 s a check
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {"alice": slow}}))
    server = serve(path)
    started.append(server)
    plain = f"http://127.0.0.1:{server.server_address[1]}/hello"
    codes: list[int] = []

    def guess(i: int) -> None:
        codes.append(requests.get(plain, auth=("alice", f"guess-{i}"), timeout=30).status_code)

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(set(codes)) == [401, 503], codes  # one hashed at a time, the rest told to wait
    assert server.basic_auth.hashes < 8
