"""``.stack/env``, which README's "Your own container" sources before ``gpuguard run``: in a
new shell, with nothing of gpuguard's on ``PATH``, it is all that is needed (issue 26)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuguard.demo.stack.gpusim import GpusimService
from gpuguard.demo.stack.localstack import env_file_text, user_env

#: a login shell's PATH on Debian, without any virtualenv
NEW_SHELL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _in_new_shell(env_file: Path, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f". {env_file}\n{script}"],
        env={"PATH": NEW_SHELL_PATH, "HOME": str(env_file.parent)},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_the_env_file_puts_the_demos_gpuguard_on_path(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "gpuguard").exists():
        pytest.skip("not run from a virtualenv with the gpuguard script")
    gpusim_dir = tmp_path / "node 1" / "gpusim"  # a space: the values are quoted
    env = tmp_path / "env"
    env.write_text(env_file_text({"GPUSIM_DIR": str(gpusim_dir), "DOCKER_HOST": "unix:///x"},
                                 bin_dir))  # fmt: skip
    done = _in_new_shell(env, 'command -v gpuguard; gpuguard --version; echo "$GPUSIM_DIR"')
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(bin_dir / "gpuguard"), "gpuguard 0.1.0",
                                        str(gpusim_dir)]  # fmt: skip
    # without the file, a new shell has no gpuguard: what the newcomer met
    bare = subprocess.run(["bash", "-c", "command -v gpuguard"], env={"PATH": NEW_SHELL_PATH},
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert bare.returncode != 0


def test_no_path_line_without_a_gpuguard_script(tmp_path: Path) -> None:
    text = env_file_text({"DOCKER_HOST": "unix:///x"}, tmp_path)
    assert "PATH" not in text and "export DOCKER_HOST=unix:///x\n" in text


def test_gpusim_status_works_after_sourcing_the_env_file(
    gpusim_daemon: Callable[..., GpusimService], tmp_path: Path
) -> None:
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "gpusim").exists():
        pytest.skip("not run from a virtualenv with the gpusim script")
    sim = gpusim_daemon()
    values = user_env("unix:///x", sim, "http://127.0.0.1:9", "http://127.0.0.1:9")
    env = tmp_path / "env"
    env.write_text(env_file_text(values, bin_dir))
    done = _in_new_shell(env, "gpusim status")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("GPU ") and "(no processes)" in done.stdout
