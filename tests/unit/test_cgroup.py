from __future__ import annotations

from pathlib import Path

import pytest

from gpuguard.exporter.cgroup import ProcReader, container_id_from_cgroup, start_ticks_from_stat
from gpuguard.exporter.errors import ProcfsError
from tests.unit.exporter_fakes import FakeProcfs, cid

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup"
ID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("v1_docker.txt", ID),
        ("v2_docker_scope.txt", ID),
        ("v2_docker_scope_nested.txt", ID),
        ("kubepods_cgroupfs.txt", ID),
        ("kubepods_cri_containerd.txt", ID),
        ("kubepods_crio.txt", ID),
        ("kubepods_guaranteed_cgroupfs.txt", ID),  # Guaranteed QoS: no QoS level in the path
        ("kubepods_besteffort_systemd_v1.txt", ID),  # systemd driver on cgroup v1, every line
        ("podman_libpod.txt", ID),
        ("docker_in_docker.txt", ID),  # innermost container wins
        ("podman_conmon.txt", None),  # the monitor process is not the container
        ("host_process.txt", None),  # a 32-hex cgroup name is no container id
    ],
)
def test_container_id_from_each_path_form(fixture: str, expected: str | None) -> None:
    assert container_id_from_cgroup((FIXTURES / fixture).read_text()) == expected


def test_every_fixture_is_covered() -> None:
    assert len(list(FIXTURES.glob("*.txt"))) == 12


def test_malformed_lines_are_skipped() -> None:
    assert container_id_from_cgroup("garbage\n\n0::\n") is None


@pytest.mark.parametrize("comm", ["python3", "my prog", "a) b (c", ")", "x)) 1 2 3 (y"])
def test_start_ticks_survive_odd_comm(comm: str) -> None:
    tail = "S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 987654 0 0"
    assert start_ticks_from_stat(f"4242 ({comm}) {tail}\n") == 987654


def test_start_ticks_of_this_process() -> None:
    text = Path("/proc/self/stat").read_text()
    assert start_ticks_from_stat(text) > 0


def test_start_ticks_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        start_ticks_from_stat("no parens here")


def test_proc_reader_resolves_and_caches_by_start_ticks(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add(100, cid(1), ticks=500, comm="worker (gpu)")
    reader = ProcReader(tmp_path)
    owner = reader.owner(100)
    assert owner is not None and owner.container_id == cid(1) and owner.start_ticks == 500
    assert reader.owner(100) is owner  # cached: same pid, same start ticks

    # PID reuse: a new process with the same pid in another container
    procfs.remove(100)
    procfs.add(100, cid(2), ticks=900)
    owner2 = reader.owner(100)
    assert owner2 is not None and owner2.container_id == cid(2) and owner2.start_ticks == 900


def test_proc_reader_gone_and_host_processes(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add(7, None, ticks=3)
    reader = ProcReader(tmp_path)
    assert reader.owner(12345) is None  # no such process
    host = reader.owner(7)
    assert host is not None and host.container_id is None
    reader.retain(set())
    assert reader._cache == {}


def test_proc_reader_check(tmp_path: Path) -> None:
    ProcReader(tmp_path).check()
    with pytest.raises(ProcfsError):
        ProcReader(tmp_path / "missing").check()


def test_proc_reader_on_real_proc() -> None:
    import os

    owner = ProcReader(Path("/proc")).owner(os.getpid())
    assert owner is not None and owner.start_ticks > 0
