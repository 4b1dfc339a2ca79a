"""gpusim's command lines: ``gpusim serve/status`` and the matmul workload."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.gpusim.cli import format_status, main
from gpuguard.gpusim.client import GpusimClient
from gpuguard.gpusim.config import DeviceSpec, parse_device_spec, parse_size
from gpuguard.gpusim.workload import main as workload_main


@pytest.fixture
def served() -> Iterator[Path]:
    """``gpusim serve`` as a subprocess with a small device; stopped by PID (SIGTERM)."""
    directory = Path(tempfile.mkdtemp(prefix="gs-"))
    sock = directory / "gpusim.sock"
    argv = [sys.executable, "-m", "gpusim", "serve", "--socket", str(sock)]
    argv += ["--device", "name=big,memory=8GiB", "--device", "name=tiny,memory=1GiB"]
    argv += ["--time-scale", "0.01", "--copy-time-scale", "0.01", "--context-memory", "100MiB"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield sock
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=5) == 0  # clean shutdown on SIGTERM
        assert not sock.exists()
        if proc.stderr:
            proc.stderr.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_sizes_and_device_specs() -> None:
    assert parse_size("24GiB") == 24 * 2**30
    assert parse_size("300MiB") == 300 * 2**20
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size("4096") == 4096
    for bad in ("", "12 parsecs", "-1GiB", "GiB"):
        with pytest.raises(ValueError):
            parse_size(bad)
    spec = parse_device_spec("name=sim0,memory=2GiB,uuid=GPU-x", 3)
    assert spec == DeviceSpec(3, "sim0", 2 * 2**30, "GPU-x")
    assert parse_device_spec("", 0).uuid == DeviceSpec(0).uuid  # stable default uuid
    for bad in ("memory", "colour=red", "memory=0"):
        with pytest.raises(ValueError):
            parse_device_spec(bad, 0)


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--time-scale", "0"],
        ["serve", "--time-scale", "fast"],
        ["serve", "--device", "memory=lots"],
        ["serve", "--context-memory", "-3"],
        ["serve", "--sample-period", "nan"],
        ["serve", "--frobnicate"],
        ["explode"],
        [],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        code = main(argv)
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpusim")


@pytest.mark.parametrize("argv", [["--version"], ["serve", "--version"], ["status", "--version"]])
def test_version(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``gpusim --version`` and each command's: the version, exit 0 (no command required)."""
    from gpuguard import __version__

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"gpusim {__version__}\n"


@pytest.mark.parametrize("env", [False, True])
def test_serve_makes_no_directory_for_a_socket(
    env: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the default socket's directory is made: a mistyped path creates nothing."""
    missing = Path("/nonexistent-gpusim-test/dir/x.sock")
    if env:
        monkeypatch.setenv("GPUSIM_SOCKET", str(missing))
    assert main(["serve"] if env else ["serve", "--socket", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no directory {missing.parent}" in err
    assert ("$GPUSIM_SOCKET" if env else "--socket") in err
    assert not Path("/nonexistent-gpusim-test").exists()


def test_status_without_daemon(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--socket", "/nonexistent/gpusim.sock"]) == 1
    assert "cannot connect" in capsys.readouterr().err


def test_status_table_and_json(served: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with GpusimClient(served) as client:
        client.context_create(1)
        client.alloc(2**30 - 100 * 2**20)
        assert main(["status", "--socket", str(served), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["time_scale"] == 0.01
        assert [d["name"] for d in status["devices"]] == ["big", "tiny"]
        tiny = status["devices"][1]
        assert tiny["memory_used_bytes"] == tiny["memory_total_bytes"] == 2**30
        assert tiny["processes"][0] | {"pid": 0} == {
            "pid": 0,
            "used_memory_bytes": 2**30,
            "phase": "idle",
            "kernels_running": 0,
            "kernels_queued": 0,
        }
        assert main(["status", "--socket", str(served)]) == 0
        table = capsys.readouterr().out
        assert f"{os.getpid():<10}1 " in table and "1.00/1.00" in table
        assert "(no processes)" in format_status({"devices": []})


def test_workload_logs_every_phase(served: Path, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    argv = ["--socket", str(served), "--size", "1024", "--repeat", "2", "--log", str(log)]
    assert workload_main([*argv, "--sleep-between", "0.05", "--chunk-bytes", "1MiB"]) == 0
    events = [json.loads(line) for line in log.read_text().splitlines()]
    names = [
        "task_start", "context_created", "input_start", "input_end", "kernel_start",
        "kernel_end", "output_start", "output_end", "task_end",
    ]  # fmt: skip
    assert [e["event"] for e in events] == names * 2
    assert [e["run"] for e in events] == [0] * 9 + [1] * 9
    assert all(e["pid"] == os.getpid() and e["size"] == 1024 for e in events)
    times = [e["t"] for e in events]
    assert times == sorted(times)
    assert events[9]["t"] - events[8]["t"] >= 0.05  # sleep between runs


def test_workload_out_of_memory_exits_3(served: Path, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    argv = ["--socket", str(served), "--device", "1", "--size", "13312", "--log", str(log)]
    assert workload_main(argv) == 3
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["event"] == "error" and last["error"] == "out_of_memory"


def test_workload_without_daemon_exits_1(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    assert workload_main(["--socket", str(tmp_path / "none.sock"), "--log", str(log)]) == 1
    assert json.loads(log.read_text().splitlines()[-1])["error"] == "unavailable"


@pytest.mark.parametrize(
    "argv", [["--size", "0"], ["--backend", "opencl"], ["--memory-bytes", "2"], ["--x"]]
)
def test_workload_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        workload_main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("gpusim.workload: error:")


@pytest.mark.parametrize("command", ["serve", "status"])
def test_every_gpusim_option_names_its_type_and_default(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuguard.gpusim.cli import _parser

    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: gpusim {command}")
    sub = next(a for a in _parser()._actions if a.dest == "command")
    parser = sub.choices[command]  # type: ignore[index]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        name = action.option_strings[-1]
        assert action.help, f"{name}: no help"
        if action.nargs == 0:
            continue  # a switch: no value to name
        # argparse's default metavar repeats the flag's name in capitals: it names no type
        assert action.choices or action.metavar, f"{name}: argparse's default metavar"
        help_text = parser._get_formatter()._expand_help(action)
        assert "default" in help_text, f"{name}: {help_text!r} hides its default"
