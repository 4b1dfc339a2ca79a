"""gpusim's driver stand-in: built, installed beside a socket, loaded only when it is the
stand-in, and each simulated operation run inside its entry point."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuguard.gpusim import driver
from gpuguard.gpusim.driver import CallKind, DriverCalls, find_stub, install
from gpuguard.native import NativeBuildError, build


@pytest.fixture(scope="module")
def stub() -> Path:
    try:
        return driver.stub_library()
    except NativeBuildError as exc:
        pytest.skip(str(exc))
    raise AssertionError("unreachable")


def test_install_puts_a_copy_beside_the_socket(stub: Path, tmp_path: Path) -> None:
    installed = install(tmp_path)
    assert installed == tmp_path / "libcuda.so.1"
    assert installed.read_bytes() == stub.read_bytes()
    assert installed.stat().st_ino != stub.stat().st_ino  # its own file: its own probes
    out = subprocess.run(["nm", "-D", str(installed)], capture_output=True, text=True).stdout
    for symbol in ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuGraphLaunch",
                   "cuMemcpyHtoDAsync_v2", "cuStreamSynchronize", "cuEventQuery"):  # fmt: skip
        assert f" T {symbol}\n" in out, symbol


def test_install_without_a_compiler_leaves_workloads_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse() -> Path:
        raise NativeBuildError("cannot build libcuda.so.1: gcc is not installed")

    monkeypatch.setattr(driver, "stub_library", refuse)
    assert install(tmp_path) is None and not (tmp_path / "libcuda.so.1").exists()
    assert find_stub(tmp_path / "gpusim.sock") is None


def test_calls_run_inside_the_entry_point_and_return_its_result(stub: Path) -> None:
    calls = DriverCalls(stub)
    assert calls.call(CallKind.LAUNCH, lambda: 7) == 7
    assert calls.call(CallKind.WAIT, lambda: [1, 2]) == [1, 2]
    with pytest.raises(KeyError):  # raised inside the C frame, re-raised after it
        calls.call(CallKind.COPY, lambda: {}["missing"])
    assert calls.call(CallKind.QUERY, lambda: "after") == "after"


def test_a_real_driver_or_any_other_library_is_never_called(tmp_path: Path) -> None:
    source = tmp_path / "other.c"
    source.write_text("int cuLaunchKernel(void) { return 0; }\n")
    other = build("libother.so", [source], [["gcc", "-shared", "-fPIC", "-o", "{out}", "other.c"]])
    with pytest.raises(OSError, match="not gpusim's driver stand-in"):
        DriverCalls(other)
    (tmp_path / "libcuda.so.1").write_bytes(other.read_bytes())
    assert find_stub(tmp_path / "gpusim.sock") is None


def test_a_failed_build_says_why_and_caches_nothing(tmp_path: Path) -> None:
    source = tmp_path / "bad.c"
    source.write_text("this is not C\n")
    command = [["gcc", "-shared", "-fPIC", "-o", "{out}", "bad.c"]]
    with pytest.raises(NativeBuildError, match=r"cannot build libbad\.so: gcc"):
        build("libbad.so", [source], command)
    with pytest.raises(NativeBuildError, match="nosuchcc is not installed"):
        build("libbad.so", [source], [["nosuchcc", "bad.c"]])
