"""Make what ``deploy/compose.tls.yaml`` mounts: a CA, certificates, passwords and configs.

    .venv/bin/python deploy/compose/gen_tls.py          # writes deploy/compose/tls/
    docker compose -f deploy/compose.yaml -f deploy/compose.tls.yaml up -d

Everything goes into one directory (mode 0750, files 0640, group 10001: the gpuguard image's
user, which compose.tls.yaml adds to Prometheus and Alertmanager too; run it as root or
``chgrp -R 10001`` the directory afterwards):

- ``ca.crt``/``ca.key``: a CA of this host's own; ``server.crt``/``.key`` for 127.0.0.1 and
  localhost (the exporter and the actuator); ``prometheus.crt``/``.key`` and
  ``actuator.crt``/``.key``: client certificates;
- ``*.password``: random passwords of Prometheus, the actuator and Alertmanager, and the web
  configs holding their bcrypt hashes: ``exporter-web.yml`` (client certificate and basic
  auth required), ``actuator-web.yml`` (basic auth, or the webhook's bearer token);
- ``exporter-client.yml``: the actuator's client of the exporter (--exporter.http-config-file);
- ``prometheus.yml`` and ``alertmanager.yml``: the shipped configs with their https variants
  (deploy/prometheus/prometheus.yml, deploy/alertmanager/alertmanager.yml) filled in.

Existing keys and passwords are kept (run it again to renew certificates: the servers pick
them up without a restart); ``--force`` makes everything anew.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from gpuguard.deployconfig import render_alertmanager_config, render_prometheus_config

HERE = Path(__file__).resolve().parent
CONTAINER_DIR = "/etc/gpuguard/tls"
GROUP = 10001
DAYS = "825"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def key(name: str, out: Path, force: bool) -> None:
    if force or not (out / f"{name}.key").exists():
        openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key",
                cwd=out)  # fmt: skip


def certificate(name: str, cn: str, ext: str, out: Path, force: bool) -> None:
    key(name, out, force)
    openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
            cwd=out)  # fmt: skip
    (out / f"{name}.ext").write_text(ext)
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", DAYS, "-extfile", f"{name}.ext",
        cwd=out,
    )  # fmt: skip
    (out / f"{name}.csr").unlink()
    (out / f"{name}.ext").unlink()


def password(name: str, out: Path, force: bool) -> str:
    path = out / f"{name}.password"
    if force or not path.exists():
        path.write_text(secrets.token_urlsafe(24) + "\n")
    return path.read_text().strip()


def hashed(text: str) -> str:
    return bcrypt.hashpw(text.encode(), bcrypt.gensalt(10)).decode()


def generate(out: Path, container_dir: str = CONTAINER_DIR, force: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o750)
    old_umask = os.umask(0o027)
    try:
        key("ca", out, force)
        if force or not (out / "ca.crt").exists():
            openssl("req", "-x509", "-new", "-key", "ca.key", "-out", "ca.crt", "-days", DAYS,
                    "-subj", "/CN=gpuguard compose CA", cwd=out)  # fmt: skip
        certificate("server", "127.0.0.1",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
                    out, force)  # fmt: skip
        for client in ("prometheus", "actuator"):
            certificate(client, client, "extendedKeyUsage=clientAuth\n", out, force)
        pw = {
            name: password(name, out, force) for name in ("prometheus", "actuator", "alertmanager")
        }
        write_configs(out, container_dir, pw)
    finally:
        os.umask(old_umask)
    not_owned = False
    for path in [out, *out.iterdir()]:
        os.chmod(path, 0o750 if path.is_dir() else 0o640)  # openssl writes keys 0600
        try:
            os.chown(path, -1, GROUP)
        except PermissionError:
            not_owned = True
    if not_owned:
        print(f"note: chgrp -R {GROUP} {out} (not root here)", file=sys.stderr)


def write_configs(out: Path, d: str, pw: dict[str, str]) -> None:
    tls = {"cert_file": f"{d}/server.crt", "key_file": f"{d}/server.key", "min_version": "TLS12"}
    exporter_web = {
        "tls_server_config": {**tls, "client_auth_type": "RequireAndVerifyClientCert",
                              "client_ca_file": f"{d}/ca.crt"},
        "basic_auth_users": {"prometheus": hashed(pw["prometheus"]),
                             "actuator": hashed(pw["actuator"])},
    }  # fmt: skip
    actuator_web = {
        "tls_server_config": tls,
        "basic_auth_users": {"alertmanager": hashed(pw["alertmanager"]),
                             "prometheus": hashed(pw["prometheus"])},
    }  # fmt: skip
    exporter_client = {
        "tls_config": {"ca_file": f"{d}/ca.crt", "cert_file": f"{d}/actuator.crt",
                       "key_file": f"{d}/actuator.key"},
        "basic_auth": {"username": "actuator", "password_file": f"{d}/actuator.password"},
    }  # fmt: skip
    scrape: dict[str, Any] = {
        "scheme": "https",
        "tls_config": {"ca_file": f"{d}/ca.crt", "cert_file": f"{d}/prometheus.crt",
                       "key_file": f"{d}/prometheus.key"},
        "basic_auth": {"username": "prometheus", "password_file": f"{d}/prometheus.password"},
    }  # fmt: skip
    prometheus = render_prometheus_config(
        profile="default",
        rule_files=[Path("/etc/gpuguard/rules/*.rules.yml")],
        guards=("127.0.0.1:10838",),  # the guard has no web config: plain, on loopback
        tenant_engines=("unix:///var/run/docker.sock",),
        scrape_http_config=scrape,
    )
    alertmanager = render_alertmanager_config(
        "https://127.0.0.1:10836/api/v1/alerts",
        None,
        http_config={
            "tls_config": {"ca_file": f"{d}/ca.crt"},
            "basic_auth": {"username": "alertmanager",
                           "password_file": f"{d}/alertmanager.password"},
        },
    )  # fmt: skip
    for name, doc in (("exporter-web.yml", exporter_web), ("actuator-web.yml", actuator_web),
                      ("exporter-client.yml", exporter_client)):  # fmt: skip
        (out / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    (out / "prometheus.yml").write_text(prometheus)
    (out / "alertmanager.yml").write_text(alertmanager)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "tls", help="where to write")
    parser.add_argument("--container-dir", default=CONTAINER_DIR,
                        help="where compose.tls.yaml mounts it (default: %(default)s)")  # fmt: skip
    parser.add_argument("--force", action="store_true", help="new keys and passwords too")
    args = parser.parse_args(argv)
    generate(args.out, args.container_dir, args.force)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
