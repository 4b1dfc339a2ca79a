"""How gpuguard's clients reach a server behind a web config: a file in Prometheus' format.

The actuator's exporter client (``--exporter.http-config-file``) and the placer's Prometheus
client (``--prometheus.http-config-file``) take the part of Prometheus' ``http_config`` that
matters here, so the same block that a scrape job or an Alertmanager receiver holds can be
copied over::

    tls_config:
      ca_file: ca.crt            # verify the server with this CA (default: the system's)
      cert_file: client.crt      # present this client certificate ...
      key_file: client.key       # ... with this key
      insecure_skip_verify: false
    basic_auth:
      username: actuator
      password_file: actuator.password   # or password: ...

Relative file names are relative to the file. Anything else is refused naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from gpuguard import files, loader
from gpuguard.flags import ConfigError

MAX_SECRET_BYTES = 4096


@dataclass(frozen=True)
class ClientConfig:
    """TLS and credentials for requests to one kind of server."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure_skip_verify: bool = False
    username: str | None = None
    password: str = field(default="", repr=False)

    def session(self) -> requests.Session:
        """A ``requests`` session that verifies and authenticates as configured."""
        session = _Session()
        if self.insecure_skip_verify:
            session.verify = False
        elif self.ca_file is not None:
            session.verify = str(self.ca_file)
        if self.cert_file is not None and self.key_file is not None:
            session.cert = (str(self.cert_file), str(self.key_file))
        if self.username is not None:
            session.auth = (self.username, self.password)
        return session


class _Session(requests.Session):
    """A session whose own ``verify`` wins over ``$REQUESTS_CA_BUNDLE``/``$CURL_CA_BUNDLE``:
    plain requests lets the environment override it (psf/requests#3829), so a CA file
    given in the client config would be silently replaced by the system bundle."""

    def merge_environment_settings(
        self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
    ) -> Any:
        if verify is None and self.verify is not True:
            verify = self.verify
        return super().merge_environment_settings(url, proxies, stream, verify, cert)


NONE = ClientConfig()


def flag_help(target: str) -> str:
    """The help of a ``--X.http-config-file`` flag for the server at ``target``."""
    return (
        f"TLS and basic auth for {target}, in Prometheus' http_config format "
        "(tls_config, basic_auth; docs/web-config.md)"
    )


def load_client_config(path: Path | str | None, flag: str) -> ClientConfig:
    """The client config in the file ``--flag`` names (None: plain defaults)."""
    if path is None or str(path) == "":
        return NONE
    path = Path(str(path))
    doc = loader.read_yaml(path, f"--{flag}")
    return parse_client_config(doc, path, flag)


def parse_client_config(doc: Any, path: Path, flag: str) -> ClientConfig:
    def fail(key: str, why: str) -> ConfigError:
        return ConfigError(f"--{flag} {path}: {key}: {why}")

    doc = doc or {}
    if not isinstance(doc, dict):
        raise ConfigError(f"--{flag} {path}: must be a mapping")
    _known(doc, {"tls_config", "basic_auth"}, "", fail)
    tls = doc.get("tls_config") or {}
    auth = doc.get("basic_auth") or {}
    for key, section in (("tls_config", tls), ("basic_auth", auth)):
        if not isinstance(section, dict):
            raise fail(key, "must be a mapping")
    _known(tls, {"ca_file", "cert_file", "key_file", "insecure_skip_verify"}, "tls_config.", fail)
    _known(auth, {"username", "password", "password_file"}, "basic_auth.", fail)

    def file(name: str) -> Path | None:
        value = tls.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise fail(f"tls_config.{name}", "must be a file name")
        resolved = path.parent / value
        try:
            files.read_bytes(resolved, 1 << 20)
        except OSError as exc:
            raise fail(f"tls_config.{name}", f"cannot read {resolved}: {exc.strerror}") from None
        return resolved

    ca, cert, private = file("ca_file"), file("cert_file"), file("key_file")
    if (cert is None) != (private is None):
        raise fail("tls_config.cert_file", "cert_file and key_file go together")
    skip = tls.get("insecure_skip_verify", False)
    if not isinstance(skip, bool):
        raise fail("tls_config.insecure_skip_verify", "must be true or false")
    username, password = _basic_auth(auth, path, fail)
    return ClientConfig(ca, cert, private, skip, username, password)


def _basic_auth(auth: dict[Any, Any], path: Path, fail: Any) -> tuple[str | None, str]:
    if not auth:
        return None, ""
    username = auth.get("username")
    if not isinstance(username, str) or not username or ":" in username:
        raise fail("basic_auth.username", "must be a user name without ':'")
    if "password" in auth and "password_file" in auth:
        raise fail("basic_auth.password", "give password or password_file, not both")
    if "password_file" in auth:
        name = auth["password_file"]
        if not isinstance(name, str) or not name:
            raise fail("basic_auth.password_file", "must be a file name")
        try:
            password = files.read_text(path.parent / name, MAX_SECRET_BYTES).strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or "not UTF-8"
            raise fail("basic_auth.password_file", f"cannot read {name}: {why}") from None
        return username, password
    password = auth.get("password", "")
    if not isinstance(password, str):
        raise fail("basic_auth.password", "must be text")
    return username, password


def _known(doc: dict[Any, Any], known: set[str], prefix: str, fail: Any) -> None:
    for key in doc:
        if key not in known:
            raise fail(f"{prefix}{key}", f"unknown key (known: {', '.join(sorted(known))})")
