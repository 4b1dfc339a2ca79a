"""``gpuguard demo`` before it starts anything: a second demo while one is up refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuguard.cli import main
from gpuguard.demo.stack.localstack import RECORD, running_recorded, write_record
from tests.waiting import wait_for

ROOT_FIRST = pytest.mark.skipif(os.geteuid() != 0, reason="the demo checks for root first")


@ROOT_FIRST
@pytest.mark.parametrize(
    ("where", "needle"),
    [("/proc/nope", "--dir /proc/nope: cannot make it or write in it (No such file"),
     ("/etc/hostname/x", "--dir /etc/hostname/x: cannot make it or write in it (Not a dir")],
)  # fmt: skip
def test_a_directory_the_demo_cannot_use_is_one_line_and_exit_2(
    where: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--dir", where]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("gpuguard demo: ")
    assert needle in err
    assert not Path(where).exists()


@ROOT_FIRST
def test_a_second_demo_refuses_while_one_is_up_and_leaves_it_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a process whose command line names it as the demo's exporter, as the record says
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "exporter"])
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        wait_for(lambda: b"exporter" in cmdline.read_bytes(), 10, "the stand-in's exec")
        write_record(tmp_path, [{"kind": "process", "name": "exporter", "pid": proc.pid}])
        assert [e["pid"] for e in running_recorded(tmp_path)] == [proc.pid]
        status = main(["demo", "--dir", str(tmp_path)])
        out, err = capsys.readouterr()
        assert status == 1 and out == ""
        assert err.count("\n") == 1 and "a demo stack is already up" in err
        assert f"gpuguard demo --stop --dir {tmp_path}" in err
        assert proc.poll() is None  # not stopped, not replaced
        assert (tmp_path / RECORD).exists()
    finally:
        proc.kill()
        proc.wait(timeout=5)
    assert running_recorded(tmp_path) == []  # its processes gone: the demo may start again


def test_no_record_or_a_torn_one_is_no_stack(tmp_path: Path) -> None:
    assert running_recorded(tmp_path) == []
    (tmp_path / RECORD).write_text("[{")
    assert running_recorded(tmp_path) == []
