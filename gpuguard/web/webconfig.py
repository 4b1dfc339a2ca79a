"""``--web.config.file``: TLS, client certificates and basic auth, in exporter-toolkit's format.

The file is the one Prometheus, Alertmanager and node_exporter take, so an operator writes
one format for the whole stack; what gpuguard accepts, refuses and ignores of it is in
docs/web-config.md (Python's ``ssl`` has no verify callback, so ``RequestClientCert`` and
``RequireAnyClientCert`` are refused with the value to use instead).

``load_web_config`` parses and validates everything once (``ConfigError`` naming the key,
the CLI exits 2); ``WebConfigWatcher`` re-reads the file and the files it names when any of
them changes, keeping the old config when the new one is bad; ``BasicAuth`` checks
credentials with bcrypt, remembering outcomes so a scrape every second costs one hash at most.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import re
import ssl
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard import files, loader
from gpuguard.flags import ConfigError

log = logging.getLogger("gpuguard.web.webconfig")

FLAG = "--web.config.file"
MAX_PEM_BYTES = 1 << 20
#: Go's crypto/tls ClientAuthType names -> what Python's ssl can do.
CLIENT_AUTH: dict[str, ssl.VerifyMode] = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
TLS_VERSIONS: dict[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
#: Go's names of the TLS 1.2 suites crypto/tls.CipherSuites() offers -> OpenSSL's names.
CIPHER_SUITES: dict[str, str] = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
}
#: The response headers exporter-toolkit lets a web config set (and their allowed values).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
_TLS_KEYS = {
    "cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
    "max_version", "cipher_suites", "prefer_server_cipher_suites", "client_allowed_sans",
}  # fmt: skip
_UNSUPPORTED = {
    "tls_server_config.cert": "give cert_file",
    "tls_server_config.key": "give key_file",
    "tls_server_config.client_ca": "give client_ca_file",
    "tls_server_config.curve_preferences": "OpenSSL's defaults apply",
    "rate_limit": "each server already bounds connections and time",
}
_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
MAX_USERS = 1000
#: checks run one at a time; at cost 12 (0.30 s) one stays far inside a scrape's timeout,
#: at 31 one wrong password would hold the checker for hours (docs/web-config.md)
MAX_BCRYPT_COST = 12
_COST_10_CHECK_S = 0.07


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path
    key_file: Path
    client_auth: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True
    #: a client certificate must carry one of these SANs (DNS, IP, e-mail or URI), exactly
    client_allowed_sans: tuple[str, ...] = ()

    def admits(self, peercert: Mapping[str, Any] | None) -> bool:
        """Whether a verified client certificate passes ``client_allowed_sans``."""
        if not self.client_allowed_sans:
            return True
        sans = {str(value) for _, value in (peercert or {}).get("subjectAltName", ())}
        return bool(sans & set(self.client_allowed_sans))

    def files(self) -> tuple[Path, ...]:
        named = (self.cert_file, self.key_file, self.client_ca_file)
        return tuple(p for p in named if p is not None)


@dataclass(frozen=True)
class WebConfig:
    """One parsed, validated web config; ``context`` is None when it serves plain HTTP."""

    path: Path | None = None
    tls: TlsSettings | None = None
    headers: tuple[tuple[str, str], ...] = ()
    users: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def authenticates(self) -> bool:
        """Whether every request must prove who it is (basic auth or a verified client cert)."""
        return bool(self.users) or (
            self.tls is not None and self.tls.client_auth == "RequireAndVerifyClientCert"
        )

    def files(self) -> tuple[Path, ...]:
        """The files whose change means a reload: this file and those it names."""
        own = (self.path,) if self.path is not None else ()
        return own + (self.tls.files() if self.tls is not None else ())


PLAIN = WebConfig()


def load_web_config(path: Path | str) -> WebConfig:
    """Read, validate and build ``path``; ``ConfigError`` naming the key when anything is wrong."""
    path = Path(path)
    doc = loader.read_yaml(path, FLAG)
    return parse_web_config(doc, path)


def parse_web_config(doc: Any, path: Path) -> WebConfig:
    """A web config from its YAML document; relative file names are relative to ``path``'s
    directory, as in exporter-toolkit. Builds the TLS context, so unreadable or mismatched
    certificates are refused here too."""

    def fail(key: str, why: str) -> ConfigError:
        return ConfigError(f"{FLAG} {path}: {key}: {why}")

    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{FLAG} {path}: must be a mapping")
    _refuse_unknown(doc, {"tls_server_config", "http_server_config", "basic_auth_users"}, "", fail)
    tls = _tls(_section(doc, "tls_server_config", fail), path.parent, fail)
    headers = _headers(_section(doc, "http_server_config", fail), fail)
    users = _users(doc.get("basic_auth_users"), fail)
    context = server_context(tls, fail) if tls is not None else None
    return WebConfig(path, tls, headers, users, context)


def _section(doc: dict[Any, Any], key: str, fail: Callable[[str, str], ConfigError]) -> Any:
    value = doc.get(key)
    if value is not None and not isinstance(value, dict):
        raise fail(key, "must be a mapping")
    return value or {}


def _refuse_unknown(
    doc: dict[Any, Any], known: set[str], prefix: str, fail: Callable[[str, str], ConfigError]
) -> None:
    for key in doc:
        name = f"{prefix}{key}"
        if name in _UNSUPPORTED:
            raise fail(name, f"not supported by gpuguard ({_UNSUPPORTED[name]})")
        if key not in known:
            raise fail(name, f"unknown key (known: {', '.join(sorted(known))})")


def _tls(
    doc: dict[Any, Any], base: Path, fail: Callable[[str, str], ConfigError]
) -> TlsSettings | None:
    if not doc:
        return None
    _refuse_unknown(doc, _TLS_KEYS, "tls_server_config.", fail)
    key = "tls_server_config."

    def string(name: str, default: str | None = None) -> str | None:
        value = doc.get(name, default)
        if value is not None and (not isinstance(value, str) or not value):
            raise fail(key + name, "must be a non-empty string")
        return value

    def file(name: str) -> Path | None:
        value = string(name)
        return None if value is None else base / value

    cert, private = file("cert_file"), file("key_file")
    if cert is None or private is None:
        missing = "cert_file" if cert is None else "key_file"
        raise fail(key + missing, "missing (TLS needs cert_file and key_file)")
    client_auth = string("client_auth_type", "NoClientCert") or "NoClientCert"
    if client_auth in _UNVERIFIED_CLIENT_AUTH:
        raise fail(
            key + "client_auth_type",
            f"{client_auth} accepts unverified certificates, which Python's ssl cannot do: "
            "use RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file",
        )
    if client_auth not in CLIENT_AUTH:
        raise fail(
            key + "client_auth_type", f"{client_auth!r}: must be one of {', '.join(CLIENT_AUTH)}"
        )
    client_ca = file("client_ca_file")
    if client_auth != "NoClientCert" and client_ca is None:
        raise fail(key + "client_ca_file", f"required with client_auth_type {client_auth}")
    if client_auth == "NoClientCert" and client_ca is not None:
        raise fail(key + "client_ca_file", "given, but client_auth_type is NoClientCert")
    versions = []
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = string(name, default) or default
        if value not in TLS_VERSIONS:
            raise fail(key + name, f"{value!r}: must be one of {', '.join(TLS_VERSIONS)}")
        versions.append(value)
    if TLS_VERSIONS[versions[0]] > TLS_VERSIONS[versions[1]]:
        raise fail(key + "max_version", "lower than min_version")
    suites = doc.get("cipher_suites") or []
    if not isinstance(suites, list) or not all(isinstance(s, str) for s in suites):
        raise fail(key + "cipher_suites", "must be a list of names")
    for suite in suites:
        if suite not in CIPHER_SUITES:
            raise fail(key + "cipher_suites", f"unknown or unsupported suite {suite!r}")
    prefer = doc.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise fail(key + "prefer_server_cipher_suites", "must be true or false")
    sans = doc.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) and s for s in sans):
        raise fail(key + "client_allowed_sans", "must be a list of names")
    if sans and client_auth != "RequireAndVerifyClientCert":
        raise fail(
            key + "client_allowed_sans",
            "needs client_auth_type RequireAndVerifyClientCert (a client without a "
            "certificate has no SAN to match)",
        )
    return TlsSettings(
        cert, private, client_auth, client_ca, versions[0], versions[1], tuple(suites), prefer,
        tuple(sans),
    )  # fmt: skip


def _headers(
    doc: dict[Any, Any], fail: Callable[[str, str], ConfigError]
) -> tuple[tuple[str, str], ...]:
    _refuse_unknown(doc, {"headers", "http2"}, "http_server_config.", fail)
    if not isinstance(doc.get("http2", True), bool):
        raise fail("http_server_config.http2", "must be true or false")
    given = doc.get("headers") or {}
    if not isinstance(given, dict):
        raise fail("http_server_config.headers", "must be a mapping")
    headers = []
    for name, value in given.items():
        key = f"http_server_config.headers.{name}"
        if name not in HEADERS:
            raise fail(key, f"not a header a web config may set ({', '.join(HEADERS)})")
        if not isinstance(value, str) or not value.isprintable():
            raise fail(key, "must be one line of text")
        allowed = HEADERS[name]
        if allowed is not None and value.lower() not in allowed:
            raise fail(key, f"{value!r}: must be one of {', '.join(allowed)}")
        if value:
            headers.append((str(name), value))
    return tuple(headers)


def _users(doc: Any, fail: Callable[[str, str], ConfigError]) -> dict[str, bytes]:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise fail("basic_auth_users", "must be a mapping of user names to bcrypt hashes")
    if len(doc) > MAX_USERS:
        raise fail("basic_auth_users", f"more than {MAX_USERS} users")
    users = {}
    for name, hashed in doc.items():
        key = f"basic_auth_users.{name}"
        if not isinstance(name, str) or not name or ":" in name or not name.isprintable():
            raise fail(key, "a user name is printable text without ':'")
        match = _BCRYPT.fullmatch(hashed) if isinstance(hashed, str) else None
        if match is None:
            raise fail(key, "not a bcrypt hash ($2b$10$ and 53 more characters; "
                       "docs/web-config.md says how to make one)")  # fmt: skip
        cost = int(match.group(1))
        if cost > MAX_BCRYPT_COST:
            raise fail(
                key,
                f"bcrypt cost {cost} is more than {MAX_BCRYPT_COST}: each check would take about "
                f"{_duration(_COST_10_CHECK_S * 2 ** (cost - 10))}, one at a time; hash the "
                "password again with cost 10",
            )
        users[name] = hashed.encode()
    return users


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.0f} minutes" if seconds < 7200 else f"{seconds / 3600:.0f} hours"


def server_context(tls: TlsSettings, fail: Callable[[str, str], ConfigError]) -> ssl.SSLContext:
    """A server-side ``SSLContext`` for ``tls``; unreadable or mismatched files are ``fail``s."""
    key = "tls_server_config."
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    if tls.cipher_suites:
        context.set_ciphers(":".join(CIPHER_SUITES[s] for s in tls.cipher_suites))
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    for name, path in (("cert_file", tls.cert_file), ("key_file", tls.key_file)):
        _pem(path, key + name, fail)
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise fail(
            key + "cert_file", f"{tls.cert_file} with {tls.key_file}: {_ssl_why(exc)}"
        ) from None
    context.verify_mode = CLIENT_AUTH[tls.client_auth]
    if tls.client_ca_file is not None:
        data = _pem(tls.client_ca_file, key + "client_ca_file", fail)
        try:
            context.load_verify_locations(cadata=data.decode("ascii"))
        except (ssl.SSLError, ValueError) as exc:
            raise fail(key + "client_ca_file", f"{tls.client_ca_file}: {_ssl_why(exc)}") from None
    return context


def _pem(path: Path, key: str, fail: Callable[[str, str], ConfigError]) -> bytes:
    try:
        data = files.read_bytes(path, MAX_PEM_BYTES)
    except OSError as exc:
        raise fail(key, f"cannot read {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise fail(key, f"{path}: not a PEM file")
    return data


def _ssl_why(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__


# --- reload ---------------------------------------------------------------------------------


class WebConfigWatcher:
    """The current web config of a server, re-read when the file or a file it names changes.

    ``current()`` is cheap: it stats the files at most every ``check_every_s`` (as
    exporter-toolkit reads the file per request, but without a parse per request). A new
    file that is invalid, or that would switch TLS on or off (a restart's job: clients and
    the listening scheme change) or drop all authentication from a server that requires it,
    is refused: the old config stays, the error is logged once, and
    ``last_reload_successful`` says so until a good file comes.
    """

    def __init__(
        self,
        initial: WebConfig,
        *,
        require_auth: bool = False,
        check_every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = initial
        # only what the server started with can be relied on
        self.require_auth = require_auth and initial.authenticates
        self._check_every_s = check_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._checked = clock()
        self._seen = _signature(initial.files())
        self.last_reload_successful = True
        self.last_reload_time = time.time()
        self.reloads = 0
        self.failures = 0
        #: TLS connections refused, by why: ``handshake`` (no or a bad client certificate, a
        #: protocol or cipher mismatch, a timeout) or ``client_san`` (not in client_allowed_sans)
        self.tls_refused: Counter[str] = Counter()

    @property
    def path(self) -> Path | None:
        return self._config.path

    def current(self) -> WebConfig:
        now = self._clock()
        if self._config.path is None or now - self._checked < self._check_every_s:
            return self._config
        with self._lock:
            if now - self._checked >= self._check_every_s:
                self._checked = now
                self._maybe_reload()
        return self._config

    def _maybe_reload(self) -> None:
        files_now = self._config.files()
        seen = _signature(files_now)
        if seen == self._seen:
            return
        self._seen = seen
        assert self._config.path is not None
        try:
            new = load_web_config(self._config.path)
            self._compatible(new)
        except ConfigError as exc:
            self.failures += 1
            self.last_reload_successful = False
            log.error("web config not reloaded, keeping the previous one: %s", exc)
            return
        self._config = new
        self._seen = _signature(new.files())
        self.reloads += 1
        self.last_reload_successful = True
        self.last_reload_time = time.time()
        log.info("web config reloaded from %s", new.path)

    def _compatible(self, new: WebConfig) -> None:
        if (new.tls is None) != (self._config.tls is None):
            raise ConfigError(
                f"{FLAG} {new.path}: switching TLS {'on' if new.tls else 'off'} needs a restart"
            )
        if self.require_auth and not new.authenticates:
            raise ConfigError(
                f"{FLAG} {new.path}: basic_auth_users (or verified client certificates) "
                "cannot be dropped while this server relies on them: restart to do that"
            )


def _signature(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    """What changes when a file is rewritten or replaced (a Kubernetes Secret swaps a link)."""
    result: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            result.append(None)
            continue
        result.append((info.st_mtime_ns, info.st_size, info.st_ino))
    return tuple(result)


# --- basic auth -----------------------------------------------------------------------------


def parse_basic(header: str | None) -> tuple[str, str] | None:
    """User and password of ``Authorization: Basic <base64>``; None when it is not one."""
    scheme, _, encoded = (header or "").partition(" ")
    if scheme.lower() != "basic" or len(encoded) > 4096:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


# bcrypt of a random password no one knows, cost 10: unknown users cost as much as known ones,
# so timing does not tell which user names exist (exporter-toolkit does the same).
_NO_USER_HASH = b"$2b$10$rV9KAPQJ16ou4.PaGW2LWeWkmC0BL6zSuTYyaLbBmaf3lUn9c86uy"


class BasicAuth:
    """Checks credentials against bcrypt hashes, remembering the last ``size`` outcomes.

    The cache key is a SHA-256 of user, hash and password (no password is kept in memory), so
    a changed hash in a reloaded file is a miss. ``check`` may take a bcrypt's time (about
    70 ms at cost 10): callers on an event loop ask ``cached`` first and run ``check`` in a
    thread. One bcrypt runs at a time, so a flood of wrong passwords costs one core at most.
    """

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._outcomes: OrderedDict[bytes, bool] = OrderedDict()
        self._lock = threading.Lock()
        self._hashing = threading.Lock()
        self.hashes = 0  # bcrypt computations done (the cache's misses)

    def cached(self, users: Mapping[str, bytes], user: str, password: str) -> bool | None:
        key = self._key(users, user, password)
        with self._lock:
            outcome = self._outcomes.get(key)
            if outcome is not None:
                self._outcomes.move_to_end(key)
            return outcome

    def check(self, users: Mapping[str, bytes], user: str, password: str) -> bool:
        import bcrypt

        outcome = self.cached(users, user, password)
        if outcome is not None:
            return outcome
        hashed = users.get(user)
        with self._hashing:
            self.hashes += 1
            try:
                matched = bcrypt.checkpw(password.encode(), hashed or _NO_USER_HASH)
            except ValueError:  # longer than bcrypt's 72 bytes: never one we hashed
                matched = False
        outcome = matched and hashed is not None
        with self._lock:
            self._outcomes[self._key(users, user, password)] = outcome
            while len(self._outcomes) > self._size:
                self._outcomes.popitem(last=False)
        return outcome

    @staticmethod
    def _key(users: Mapping[str, bytes], user: str, password: str) -> bytes:
        hashed = users.get(user, b"")
        digest = hashlib.sha256()
        for part in (user.encode(), hashed, password.encode()):
            digest.update(len(part).to_bytes(4, "big") + part)
        return digest.digest()


# --- wiring ---------------------------------------------------------------------------------

FLAG_HELP = (
    "web config in exporter-toolkit's format: TLS, client certificates, basic auth; "
    "re-read when it changes (docs/web-config.md)"
)


def web_config_from_flag(value: Any) -> WebConfig | None:
    """The validated ``--web.config.file`` (None when not given); ``ConfigError`` when bad."""
    if value is None or str(value) == "":
        return None
    return load_web_config(Path(str(value)))


class WebConfigCollector:
    """``gpuguard_web_config_*``: whether the last reload of the web config worked.

    # HELP gpuguard_web_config_last_reload_successful Whether the last web config reload ...
    # TYPE gpuguard_web_config_last_reload_successful gauge
    gpuguard_web_config_last_reload_successful 1.0
    """

    def __init__(self, watcher: WebConfigWatcher) -> None:
        self._watcher = watcher

    def describe(self) -> list[Any]:
        return list(self._families(1.0, 0.0, 0.0))

    def collect(self) -> list[Any]:
        w = self._watcher
        w.current()  # a scrape notices a change even when no connection came
        ok = 1.0 if w.last_reload_successful else 0.0
        return list(self._families(ok, w.last_reload_time, float(w.failures), w.tls_refused))

    @staticmethod
    def _families(
        ok: float, when: float, failures: float, refused: Mapping[str, int] | None = None
    ) -> tuple[Any, ...]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        tls = CounterMetricFamily(
            "gpuguard_web_tls_refused_connections",
            "TLS connections refused: a failed handshake (no or a bad client certificate, "
            "a protocol mismatch, a timeout) or a client certificate outside "
            "client_allowed_sans.",
            labels=["reason"],
        )
        for reason in ("handshake", "client_san"):
            tls.add_metric([reason], float((refused or {}).get(reason, 0)))
        return (
            tls,
            GaugeMetricFamily(
                "gpuguard_web_config_last_reload_successful",
                "Whether the last reload of --web.config.file worked (0: the previous one "
                "is still in use).",
                value=ok,
            ),
            GaugeMetricFamily(
                "gpuguard_web_config_last_reload_success_timestamp_seconds",
                "When --web.config.file was last loaded successfully.",
                value=when,
            ),
            CounterMetricFamily(
                "gpuguard_web_config_reload_failures",
                "Changed web config files that were refused.",
                value=failures,
            ),
        )
