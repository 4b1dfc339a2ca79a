"""``--web.config.file``: parsing and validation, bcrypt with its cache, reload on change."""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuguard.flags import ConfigError
from gpuguard.web import webconfig
from gpuguard.web.client import load_client_config
from gpuguard.web.webconfig import (
    BasicAuth,
    WebConfigWatcher,
    load_web_config,
    parse_basic,
)
from tests.support.tlscerts import Pki, bcrypt_hash, write_web_config


def write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def tls_doc(pki: Pki, **more: object) -> dict[str, object]:
    return {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), **more}


def test_empty_file_is_plain_http_without_auth(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("")
    config = load_web_config(path)
    assert config.context is None and config.scheme == "http"
    assert not config.users and not config.authenticates


def test_full_config_builds_a_server_context(pki: Pki, tmp_path: Path) -> None:
    doc = {
        "tls_server_config": tls_doc(
            pki,
            client_auth_type="RequireAndVerifyClientCert",
            client_ca_file=str(pki.ca),
            min_version="TLS13",
            cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
        ),
        "http_server_config": {"http2": True, "headers": {"X-Frame-Options": "deny"}},
        "basic_auth_users": {"alice": bcrypt_hash("secret")},
    }
    config = load_web_config(write(tmp_path, doc))
    assert config.context is not None and config.scheme == "https"
    assert config.context.verify_mode == ssl.CERT_REQUIRED
    assert config.context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert config.headers == (("X-Frame-Options", "deny"),)
    assert set(config.users) == {"alice"} and config.authenticates


def test_relative_file_names_are_relative_to_the_config(pki: Pki) -> None:
    path = pki.dir / "web-relative.yml"
    path.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": "server.crt",
                                                          "key_file": "server.key"}}))  # fmt: skip
    assert load_web_config(path).tls is not None


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        ({"tls_server_config": {"cert_file": "x"}}, "tls_server_config.key_file: missing"),
        ({"tls_server_confg": {}}, "tls_server_confg: unknown key"),
        ({"tls_server_config": {"cert": "PEM"}}, "tls_server_config.cert: not supported"),
        ({"rate_limit": {"burst": 1}}, "rate_limit: not supported"),
        ({"basic_auth_users": {"bob": "plain"}}, "basic_auth_users.bob: not a bcrypt hash"),
        ({"basic_auth_users": ["bob"]}, "basic_auth_users: must be a mapping"),
        ({"http_server_config": {"headers": {"Server": "x"}}},
         "http_server_config.headers.Server: not a header"),
        ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}},
         "X-Frame-Options: 'allow': must be one of deny, sameorigin"),
        ("just text", "must be a mapping"),
    ],
)  # fmt: skip
def test_bad_files_name_the_key(tmp_path: Path, doc: object, names: str) -> None:
    with pytest.raises(ConfigError, match=names.replace(".", r"\.").replace("(", r"\(")) as err:
        load_web_config(write(tmp_path, doc))
    assert str(tmp_path / "web.yml") in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("tls", "names"),
    [
        ({"client_auth_type": "RequireAnyClientCert"}, "use RequireAndVerifyClientCert"),
        ({"client_auth_type": "Sometimes"}, "client_auth_type: 'Sometimes': must be one of"),
        ({"client_auth_type": "RequireAndVerifyClientCert"}, "client_ca_file: required"),
        ({"client_ca_file": "ca.crt"}, "client_ca_file: given, but client_auth_type is"),
        ({"min_version": "TLS9"}, "min_version: 'TLS9'"),
        ({"min_version": "TLS13", "max_version": "TLS12"}, "max_version: lower than min"),
        ({"cipher_suites": ["TLS_RSA_WITH_RC4_128_SHA"]}, "unknown or unsupported suite"),
        ({"prefer_server_cipher_suites": "yes"}, "must be true or false"),
        ({"client_allowed_sans": ["a"]}, "client_allowed_sans: needs client_auth_type"),
        ({"client_allowed_sans": "a"}, "client_allowed_sans: must be a list"),
    ],
)
def test_bad_tls_settings_name_the_key(pki: Pki, tmp_path: Path, tls: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        load_web_config(write(tmp_path, {"tls_server_config": tls_doc(pki, **tls)}))


def test_unreadable_or_mismatched_certificates_are_refused(pki: Pki, tmp_path: Path) -> None:
    missing = {"cert_file": str(tmp_path / "nope.crt"), "key_file": str(pki.server_key)}
    with pytest.raises(ConfigError, match=r"tls_server_config\.cert_file: cannot read"):
        load_web_config(write(tmp_path, {"tls_server_config": missing}))
    not_pem = tmp_path / "junk.crt"
    not_pem.write_text("hello")
    junk = {"cert_file": str(not_pem), "key_file": str(pki.server_key)}
    with pytest.raises(ConfigError, match="not a PEM file"):
        load_web_config(write(tmp_path, {"tls_server_config": junk}))
    mismatched = {"cert_file": str(pki.server_cert), "key_file": str(pki.client_key)}
    with pytest.raises(ConfigError, match=r"tls_server_config\.cert_file: .* with "):
        load_web_config(write(tmp_path, {"tls_server_config": mismatched}))
    device = {"cert_file": "/dev/zero", "key_file": str(pki.server_key)}
    with pytest.raises(ConfigError, match="not a regular file"):
        load_web_config(write(tmp_path, {"tls_server_config": device}))


def _hash_of_cost(cost: int) -> str:
    """A well-formed bcrypt hash of ``cost`` (parsing never runs bcrypt on it)."""
    return f"$2b${cost:02d}$" + bcrypt_hash("x")[7:]


def test_bcrypt_cost_is_at_most_12(tmp_path: Path) -> None:
    """Checks run one at a time: cost 31 let one wrong password hold the checker ~41 hours."""
    config = load_web_config(write(tmp_path, {"basic_auth_users": {"a": _hash_of_cost(12)}}))
    assert set(config.users) == {"a"} and webconfig.MAX_BCRYPT_COST == 12
    for cost, takes in ((13, "0.6 s"), (31, "41 hours")):
        path = write(tmp_path, {"basic_auth_users": {"a": _hash_of_cost(cost)}})
        with pytest.raises(ConfigError) as err:
            load_web_config(path)
        assert str(err.value) == (
            f"--web.config.file {path}: basic_auth_users.a: bcrypt cost {cost} is more than 12: "
            f"each check would take about {takes}, one at a time; hash the password again "
            "with cost 10"
        )


def test_a_reload_to_a_costlier_hash_keeps_the_old_config(tmp_path: Path) -> None:
    path = write(tmp_path, {"basic_auth_users": {"a": _hash_of_cost(10)}})
    clock = Clock()
    watcher = WebConfigWatcher(load_web_config(path), require_auth=True, clock=clock)
    first = watcher.current()
    write(tmp_path, {"basic_auth_users": {"a": _hash_of_cost(31)}})
    bump_mtime(path)
    clock.now += 1.0
    assert watcher.current() is first
    assert not watcher.last_reload_successful and watcher.failures == 1


def test_the_docs_hash_command_makes_a_hash_the_config_takes(tmp_path: Path) -> None:
    """docs/web-config.md's one-liner (no htpasswd: ``make setup`` does not install it), run
    with the password on stdin as getpass reads it without a terminal."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "web-config.md").read_text()
    assert "htpasswd" not in text
    (line,) = [x for x in text.splitlines() if "bcrypt.hashpw" in x]
    assert line.startswith(".venv/bin/python -c '")
    code = line.removeprefix(".venv/bin/python -c '").removesuffix("'")
    done = subprocess.run([sys.executable, "-c", code], input="s3cret\n", text=True,
                          capture_output=True, timeout=30, check=True)  # fmt: skip
    hashed = done.stdout.strip()
    config = load_web_config(write(tmp_path, {"basic_auth_users": {"prometheus": hashed}}))
    assert BasicAuth().check(config.users, "prometheus", "s3cret")
    assert not BasicAuth().check(config.users, "prometheus", "s3cret!")


def test_basic_header_parsing() -> None:
    encoded = base64.b64encode(b"alice:pa:ss").decode()
    assert parse_basic(f"Basic {encoded}") == ("alice", "pa:ss")
    assert parse_basic(f"basic {encoded}") == ("alice", "pa:ss")
    assert parse_basic("Bearer abc") is None
    assert parse_basic("Basic !!!") is None
    assert parse_basic("Basic " + base64.b64encode(b"no-colon").decode()) is None
    assert parse_basic(None) is None


def test_bcrypt_outcomes_are_cached_and_a_new_hash_is_a_miss() -> None:
    auth = BasicAuth()
    users = {"alice": bcrypt_hash("right").encode()}
    assert auth.cached(users, "alice", "right") is None
    assert auth.check(users, "alice", "right") is True
    assert auth.check(users, "alice", "right") is True
    assert auth.check(users, "alice", "wrong") is False
    assert auth.check(users, "alice", "wrong") is False
    assert auth.hashes == 2  # one bcrypt per distinct (user, hash, password)
    assert auth.check(users, "mallory", "right") is False  # an unknown user costs a bcrypt too
    assert auth.hashes == 3
    assert auth.check(users, "alice", "x" * 100) is False  # beyond bcrypt's 72 bytes
    rotated = {"alice": bcrypt_hash("new").encode()}
    assert auth.cached(rotated, "alice", "right") is None
    assert auth.check(rotated, "alice", "right") is False
    assert auth.check(rotated, "alice", "new") is True


def test_bcrypt_cache_is_bounded() -> None:
    auth = BasicAuth(size=3)
    users = {"alice": bcrypt_hash("right").encode()}
    for i in range(5):
        auth.check(users, "alice", f"guess-{i}")
    assert len(auth._outcomes) == 3


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def bump_mtime(path: Path) -> None:
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))


def test_reload_picks_up_a_new_hash_and_keeps_the_old_on_a_bad_file(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_web_config(tmp_path / "web.yml", pki, {"alice": "one"})
    clock = Clock()
    watcher = WebConfigWatcher(load_web_config(path), require_auth=True, clock=clock)
    first = watcher.current()
    write_web_config(path, pki, {"alice": "two"})
    bump_mtime(path)
    assert watcher.current() is first  # not checked again within a second
    clock.now += 1.0
    second = watcher.current()
    assert second is not first and second.users != first.users
    assert watcher.reloads == 1 and watcher.last_reload_successful

    path.write_text("basic_auth_users: [oops]\n")
    bump_mtime(path)
    clock.now += 1.0
    assert watcher.current() is second
    assert not watcher.last_reload_successful and watcher.failures == 1
    assert "web config not reloaded" in caplog.text
    clock.now += 1.0
    watcher.current()
    assert watcher.failures == 1  # an unchanged bad file is reported once

    write_web_config(path, pki, None)  # no users left on a server that relies on them
    bump_mtime(path)
    clock.now += 1.0
    assert watcher.current() is second and watcher.failures == 2

    write_web_config(path, None, {"alice": "three"})  # TLS off: a restart's job
    bump_mtime(path)
    clock.now += 1.0
    assert watcher.current() is second and watcher.failures == 3
    assert "needs a restart" in caplog.text


def test_reload_follows_a_renewed_certificate(pki: Pki, tmp_path: Path) -> None:
    cert = tmp_path / "server.crt"
    cert.write_bytes(pki.server_cert.read_bytes())
    path = write(tmp_path, {"tls_server_config": {"cert_file": "server.crt",
                                                  "key_file": str(pki.server_key)}})  # fmt: skip
    clock = Clock()
    watcher = WebConfigWatcher(load_web_config(path), clock=clock)
    first = watcher.current()
    cert.write_bytes(pki.server_cert.read_bytes())
    bump_mtime(cert)
    clock.now += 1.0
    assert watcher.current() is not first and watcher.reloads == 1


def test_collector_reports_the_reload_state(pki: Pki, tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    path = write_web_config(tmp_path / "web.yml", pki, {"alice": "one"})
    watcher = WebConfigWatcher(load_web_config(path), check_every_s=0.0)
    registry = CollectorRegistry()
    registry.register(webconfig.WebConfigCollector(watcher))
    assert registry.get_sample_value("gpuguard_web_config_last_reload_successful") == 1.0
    path.write_text("tls_server_config: 3\n")
    bump_mtime(path)
    assert registry.get_sample_value("gpuguard_web_config_last_reload_successful") == 0.0
    assert registry.get_sample_value("gpuguard_web_config_reload_failures_total") == 1.0


def test_client_config_in_prometheus_format(pki: Pki, tmp_path: Path) -> None:
    (tmp_path / "password").write_text("s3cret\n")
    path = write(
        tmp_path,
        {
            "tls_config": {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert),
                           "key_file": str(pki.client_key)},
            "basic_auth": {"username": "actuator", "password_file": "password"},
        },
    )  # fmt: skip
    config = load_client_config(path, "exporter.http-config-file")
    session = config.session()
    assert session.verify == str(pki.ca)
    assert session.cert == (str(pki.client_cert), str(pki.client_key))
    assert session.auth == ("actuator", "s3cret")
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        ({"tls_config": {"cafile": "x"}}, "tls_config.cafile: unknown key"),
        ({"tls_config": {"ca_file": "missing.crt"}}, "tls_config.ca_file: cannot read"),
        ({"basic_auth": {"password": "x"}}, "basic_auth.username"),
        ({"basic_auth": {"username": "a", "password": "x", "password_file": "y"}},
         "not both"),
        ({"authorization": {"credentials": "x"}}, "authorization: unknown key"),
    ],
)  # fmt: skip
def test_bad_client_configs_name_the_key(tmp_path: Path, doc: object, names: str) -> None:
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")) as err:
        load_client_config(write(tmp_path, doc), "exporter.http-config-file")
    assert "--exporter.http-config-file" in str(err.value)


def test_a_server_that_started_without_authentication_may_reload_freely(
    pki: Pki, tmp_path: Path
) -> None:
    path = write_web_config(tmp_path / "web.yml", pki)  # TLS only: nothing to rely on
    clock = Clock()
    watcher = WebConfigWatcher(load_web_config(path), require_auth=True, clock=clock)
    write_web_config(path, pki, headers={"X-Frame-Options": "deny"})
    bump_mtime(path)
    clock.now += 1.0
    assert watcher.current().headers == (("X-Frame-Options", "deny"),)
    assert watcher.last_reload_successful
