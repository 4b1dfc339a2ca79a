"""The bounded reader every file an operator names goes through (gpuguard/files.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuguard import files


def test_reads_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    assert files.read_bytes(path, limit=3) == b"abc"
    assert files.read_text(path, limit=3) == "abc"


def test_missing_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        files.read_bytes(tmp_path / "missing", limit=10)


def test_larger_than_the_limit_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * 101)
    with pytest.raises(files.FileRefused, match="larger than 100 bytes"):
        files.read_bytes(path, limit=100)


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "/proc/self"])
def test_devices_and_directories_are_refused(special: str) -> None:
    # /dev/zero as a config, token or rules file read without end (MemoryError).
    with pytest.raises(files.FileRefused, match="not a regular file") as err:
        files.read_bytes(Path(special), limit=1 << 20)
    assert isinstance(err.value, OSError) and err.value.strerror


def test_a_fifo_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(files.FileRefused, match="not a regular file"):
        files.read_bytes(fifo, limit=10)


def test_links_are_followed_only_when_allowed(tmp_path: Path) -> None:
    (tmp_path / "target").write_bytes(b"secret")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert files.read_bytes(tmp_path / "link", limit=10) == b"secret"  # a Kubernetes secret
    with pytest.raises(files.FileRefused, match="symbolic link"):
        files.read_bytes(tmp_path / "link", limit=10, follow_symlinks=False)


def test_state_files_are_created_private_and_never_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep me")
    outside.chmod(0o644)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "f").symlink_to(outside)
    with pytest.raises(files.FileRefused, match="symbolic link"):
        files.open_state_file(tmp_path / "state" / "f", os.O_WRONLY | os.O_APPEND)
    assert outside.read_bytes() == b"keep me" and outside.stat().st_mode & 0o777 == 0o644
    fd = files.open_state_file(tmp_path / "state" / "g", os.O_WRONLY | os.O_APPEND)
    os.close(fd)
    assert (tmp_path / "state" / "g").stat().st_mode & 0o777 == 0o600


def test_replace_writes_whole_files_and_never_follows_a_planted_temp_link(tmp_path: Path) -> None:
    path = tmp_path / "doc"
    files.replace(path, b"one")
    files.replace(path, b"two", durable=False)
    assert path.read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc"]
    assert path.stat().st_mode & 0o777 == 0o600
