"""A throwaway PKI for tests: a CA, a server certificate for 127.0.0.1/localhost, a client
certificate, made with the ``openssl`` command line (EC P-256 keys: fast), and web configs."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import yaml

from tests.prereq import unavailable


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: verifying with it fails
    rogue_cert: Path  # a client certificate signed by other_ca
    rogue_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _key(name: str, cwd: Path) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", name, cwd=cwd)


def _ca(name: str, cwd: Path) -> None:
    _key(f"{name}.key", cwd)
    _openssl(
        "req", "-x509", "-new", "-key", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
        "-subj", f"/CN=gpuguard test {name}", cwd=cwd,
    )  # fmt: skip


def _signed(name: str, ca: str, cn: str, ext: str, cwd: Path) -> None:
    _key(f"{name}.key", cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
             cwd=cwd)  # fmt: skip
    (cwd / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=cwd,
    )  # fmt: skip


def make_pki(directory: Path) -> Pki:
    if shutil.which("openssl") is None:
        unavailable("openssl not installed")
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", directory)
    _ca("other-ca", directory)
    _signed(
        "server", "ca", "127.0.0.1",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n", directory,
    )  # fmt: skip
    _signed(
        "client", "ca", "prometheus",
        "subjectAltName=DNS:prometheus.test\nextendedKeyUsage=clientAuth\n", directory,
    )  # fmt: skip
    _signed("rogue", "other-ca", "rogue", "extendedKeyUsage=clientAuth\n", directory)
    d = directory
    return Pki(
        d, d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key",
        d / "other-ca.crt", d / "rogue.crt", d / "rogue.key",
    )  # fmt: skip


def bcrypt_hash(password: str, cost: int = 4) -> str:
    """A bcrypt hash as htpasswd writes it ($2y$); cost 4 keeps tests fast."""
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()
    return "$2y$" + hashed[4:]


def write_web_config(
    path: Path,
    pki: Pki | None,
    users: dict[str, str] | None = None,
    client_auth: str = "NoClientCert",
    headers: dict[str, str] | None = None,
) -> Path:
    """A web config: TLS with ``pki``'s server certificate (none: plain HTTP), ``users``
    (name -> password, hashed here), client certificates verified by ``pki.ca``."""
    doc: dict[str, object] = {}
    if pki is not None:
        tls: dict[str, object] = {
            "cert_file": str(pki.server_cert),
            "key_file": str(pki.server_key),
            "client_auth_type": client_auth,
        }
        if client_auth != "NoClientCert":
            tls["client_ca_file"] = str(pki.ca)
        doc["tls_server_config"] = tls
    if headers:
        doc["http_server_config"] = {"headers": headers}
    if users:
        doc["basic_auth_users"] = {name: bcrypt_hash(pw) for name, pw in users.items()}
    path.write_text(yaml.safe_dump(doc))
    return path
