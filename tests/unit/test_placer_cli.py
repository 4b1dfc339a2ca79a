"""``gpuguard placer``'s flags, validated once."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpuguard.cli import main
from gpuguard.placer.config import add_flags, load_config
from gpuguard.placer.errors import ConfigError
from gpuguard.placer.ranking import Policy


def config(*argv: str):
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return load_config(parser.parse_args(list(argv)))


def test_placer_defaults_bind_loopback() -> None:
    c = config()
    assert (c.listen_host, c.listen_port, c.token) == ("127.0.0.1", 10837, None)
    assert (c.policy, c.headroom, c.settle_s, c.max_age_s) == (Policy.GPUGUARD, 0.05, 10.0, 30.0)
    assert c.prometheus_url == "http://127.0.0.1:9090"


def test_placer_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"needs --web\.token-file"):
        config("--web.listen-address=0.0.0.0:10837")
    token = tmp_path / "token"
    token.write_text("abc\n")
    assert config("--web.listen-address=0.0.0.0:10837", f"--web.token-file={token}").token == "abc"


@pytest.mark.parametrize(
    "argv",
    [
        ("--placement.policy=best",),
        ("--placement.headroom=1",),
        ("--placement.headroom=nan",),
        ("--prometheus.url=ftp://x",),
        ("--records.max-age=soon",),
        ("--placement.client-rate=0",),
        ("--placement.client-rate=inf",),
        ("--placement.client-burst=0",),
    ],
)
def test_bad_placer_flags(argv: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError):
        config(*argv)


def test_reservation_limits() -> None:
    made = config("--placement.client-rate=0.5", "--placement.client-burst=3")
    assert (made.client_rate, made.client_burst) == (0.5, 3)
    assert (config().client_rate, config().client_burst) == (1.0, 10)


def test_cli_exit_2_on_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["placer", "--placement.policy=best"]) == 2
    assert capsys.readouterr().err.startswith("gpuguard placer: --placement.policy")


def test_placer_beyond_loopback_may_rely_on_a_web_config(tmp_path: Path) -> None:
    from tests.support.tlscerts import write_web_config

    web = write_web_config(tmp_path / "web.yml", None, {"scheduler": "pw"})
    c = config("--web.listen-address=0.0.0.0:10837", f"--web.config.file={web}")
    assert c.token is None and c.web is not None
    plain = write_web_config(tmp_path / "plain.yml", None)
    with pytest.raises(ConfigError, match=r"needs --web\.token-file"):
        config("--web.listen-address=0.0.0.0:10837", f"--web.config.file={plain}")


def test_placer_refuses_a_bad_web_config_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text("tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n")
    assert main(["placer", f"--web.config.file={bad}"]) == 2
    err = capsys.readouterr().err
    assert "tls_server_config.cert_file: cannot read" in err and err.count("\n") == 1
