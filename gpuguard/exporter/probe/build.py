"""Build the launch probe's static binary from ``launchprobe.bpf.c`` and ``launchprobe.c``.

clang compiles the BPF side, bpftool embeds it in a skeleton header, gcc links the user side
statically against libbpf, libelf and zlib: the one file runs on a host without them.
"""

from __future__ import annotations

from pathlib import Path

from gpuguard.native import NativeBuildError, build

BINARY_NAME = "gpuguard-launchprobe"
HERE = Path(__file__).parent
SOURCES = (HERE / "launchprobe.bpf.c", HERE / "launchprobe.c")
#: where clang finds <asm/types.h> on Debian (a BPF target has no multiarch default)
_ASM_INCLUDE = "-I/usr/include/x86_64-linux-gnu"


def probe_binary() -> Path:
    """The built probe (cached); raises ``NativeBuildError`` when a tool is missing."""
    return build(
        BINARY_NAME,
        SOURCES,
        [
            ["clang", "-O2", "-g", "-target", "bpf", "-mcpu=v3", _ASM_INCLUDE,
             "-c", "launchprobe.bpf.c", "-o", "launchprobe.bpf.o"],
            ["sh", "-c", "bpftool gen skeleton launchprobe.bpf.o name launchprobe"
             " > launchprobe.skel.h"],
            ["gcc", "-O2", "-Wall", "-static", "-I.", "-o", "{out}", "launchprobe.c",
             "-lbpf", "-lelf", "-lz"],
        ],
    )  # fmt: skip


if __name__ == "__main__":  # ``make setup``: build it now; a failure is one line, not fatal
    try:
        print(f"launch probe: {probe_binary()}")
    except NativeBuildError as exc:
        print(f"launch probe: not built ({exc})")
