"""Every way a newcomer can get a subcommand's flags wrong ends the same way: one line on
stderr naming the command and what was wrong, nothing on stdout, exit status 2, and
nothing started (each bad value is one that validation rejects before any side effect)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpuguard.cli import main

MISSING = "/nonexistent/gpuguard-test"
PLACER = ["--placer.url", "http://127.0.0.1:9"]  # never asked: the error comes first

CASES: list[tuple[str, list[str], str]] = [
    ("gpuguard", [], "the following arguments are required: COMMAND"),
    ("gpuguard", ["psx"], "invalid choice: 'psx'"),
    # issue 26: each said something else than what was wrong
    ("gpuguard", ["--bogus"], "unrecognized arguments: --bogus"),
    ("gpuguard", ["--verison"], "unrecognized arguments: --verison; did you mean --version?"),
    ("gpuguard exporter", ["--poll.interval", "-1s"], "invalid duration '-1s': must be greater"),
    ("gpuguard exporter", ["--web.listen-address", "127.0.0.1:99999"], "port 99999 is out of"),
    ("gpuguard placer", ["--placement.headroom", "-0.5"], "--placement.headroom '-0.5': must be"),
    ("gpuguard run", ["--deadline", "-9s", "img"], "invalid duration '-9s': must be greater"),
    ("gpuguard exporter", ["--bogus"], "unrecognized arguments: --bogus"),
    ("gpuguard exporter", ["--poll-interval", "1s"], "did you mean --poll.interval?"),
    ("gpuguard exporter", ["--poll.interval"], "--poll.interval: expected one argument"),
    ("gpuguard exporter", ["--poll.interval", "fast"], "--poll.interval: invalid duration"),
    ("gpuguard exporter", ["--web.listen-address", "10835"], "use host:port"),
    ("gpuguard exporter", ["--gpu.backend", "cuda"], "must be one of auto, nvml, gpusim"),
    ("gpuguard exporter", ["--config.file", MISSING], "cannot read"),
    ("gpuguard exporter", ["--trust.policy-file", MISSING], "--trust.policy-file"),
    ("gpuguard exporter", ["--trust.all=maybe"], "expected true or false"),
    ("gpuguard exporter", ["--trust.all", "--trust.policy-file", MISSING], "exclude each other"),
    ("gpuguard ps", ["--bogus"], "unrecognized arguments: --bogus"),
    ("gpuguard ps", ["--exporter.url"], "expected one argument"),
    ("gpuguard ps", ["--exporter.url", "localhost:10835"], "is not an http(s) URL"),
    ("gpuguard run", [], "--deadline is required"),
    ("gpuguard run", ["--deadline"], "--deadline needs a value"),
    ("gpuguard run", ["--deadline", "soon", "busybox"], "--deadline: invalid duration"),
    ("gpuguard run", ["--deadline", "9s", "--task", "batch", "img"], "--task: invalid"),
    ("gpuguard run", ["--deadline", "9s"], "an IMAGE is required"),
    ("gpuguard run", [*PLACER, "--deadline", "9s", "img"], "--memory is required"),
    ("gpuguard actuator", ["--bogus"], "unrecognized arguments: --bogus"),
    ("gpuguard actuator", ["--policy.order"], "expected one argument"),
    ("gpuguard actuator", [], "--web.token-file is required"),
    ("gpuguard actuator", ["--web.token-file", MISSING], "cannot read"),
    ("gpuguard actuator", ["--web.insecure", "--policy.order", "lifo"], "must be one of"),
    ("gpuguard actuator", ["--policy.preempt=nah"], "expected true or false"),
    ("gpuguard guard", ["--bogus"], "unrecognized arguments: --bogus"),
    ("gpuguard guard", ["--max-pause", "forever"], "--max-pause: invalid duration"),
    ("gpuguard nodes", ["--bogus"], "unrecognized arguments: --bogus"),
    ("gpuguard nodes", ["--actuator.url", "10836"], "is not an http(s) URL"),
    ("gpuguard nodes", [*PLACER, "--placer.token-file", MISSING], "--placer.token-file"),
    ("gpuguard placer", ["--bogus"], "unrecognized arguments: --bogus"),
    ("gpuguard placer", ["--placement.policy", "random"], "must be one of"),
    ("gpuguard placer", ["--placement.headroom", "2"], "must be in [0, 1)"),
    ("gpuguard demo", ["--bogus"], "unrecognized arguments: --bogus"),
    ("gpuguard demo", ["--containers", "many"], "'many' is not an integer"),
    ("gpuguard demo", ["--containers", "0"], "must be 1 to 20"),
    ("gpuguard demo", ["--time-scale", "0"], "must be above 0"),
    ("gpuguard demo", ["--order", "lifo"], "invalid choice: 'lifo'"),
]


@pytest.mark.parametrize(
    ("prog", "args", "needle"), CASES, ids=[" ".join([p, *a]) for p, a, _ in CASES]
)
def test_a_bad_flag_is_one_line_and_exit_2(
    prog: str,
    args: list[str],
    needle: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # whatever a bug might still create lands here
    argv = prog.split()[1:] + args
    try:
        status = main(argv)
    except SystemExit as exited:
        status = exited.code
    out, err = capsys.readouterr()
    assert status == 2, err
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"{prog}: "), err
    assert needle in err
    assert list(tmp_path.iterdir()) == []


def test_an_exporter_port_in_use_is_its_one_line_and_no_engine_is_asked(tmp_path: Path) -> None:
    """The port is taken before anything else starts: no warnings of a container source
    that starts and stops after the fatal line."""
    engine_path = tmp_path / "docker.sock"
    with socket.socket() as held, socket.socket(socket.AF_UNIX) as engine:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        engine.bind(str(engine_path))
        engine.listen()
        engine.setblocking(False)
        done = subprocess.run(
            [sys.executable, "-m", "gpuguard.cli", "exporter", "--gpu.backend", "gpusim",
             f"--gpusim.socket={tmp_path / 'none.sock'}", f"--docker.host=unix://{engine_path}",
             f"--web.listen-address=127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        *before, last = done.stderr.splitlines()
        assert last.startswith(f"gpuguard exporter: cannot listen on 127.0.0.1:{port}: Address")
        assert not [line for line in before if " INFO " not in line], done.stderr
        with pytest.raises(BlockingIOError):
            engine.accept()  # the exporter never connected to its engine
