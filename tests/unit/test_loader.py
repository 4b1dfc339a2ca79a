"""The one loader (issue 26 item 3): every document a flag names is read by
``gpuguard/loader.py``, within its size, depth, encoding and integer limits, and a hostile
file is one line naming the flag and exit status 2 from every command that reads one."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gpuguard import loader
from gpuguard.cli import main as gpuguard_main
from gpuguard.gpusim.cli import main as gpusim_main
from gpuguard.gpusim.workload.cli import main as workload_main
from gpuguard.loader import ConfigError

PACKAGE = Path(loader.__file__).resolve().parent

#: Contents no reader may choke on, each with the words its one line must hold. Bytes, so a
#: file can be anything but UTF-8.
HOSTILE: dict[str, tuple[bytes, str]] = {
    "deep-flow": (b"[" * 20_000 + b"]" * 20_000, "nested more than 64 deep"),
    "deep-block": (
        "".join(" " * i + "a:\n" for i in range(200)).encode() + b" " * 200 + b"b\n",
        "nested more than 64 deep",
    ),
    "not-utf8": (b"version: 1\nrules: \xff\xfe\x00\n", "not UTF-8"),
    "latin-1": ("default: {classes: [réal-time]}\n".encode("latin-1"), "not UTF-8"),
    "control": (b"version: 1\x07\n", "invalid YAML"),
    "laughs": (
        (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n"
                for i in range(8)
            )
        ).encode(),
        "more than 250000 values",
    ),
    "alias-loop": (b"rules: &r [*r]\n", "is inside what it names"),
    # base 60: PyYAML multiplies in a loop, quadratic (this one took 2.5 s before; 1 MiB, minutes)
    "sexagesimal": (b"version: 1" + b":1" * 50_000 + b"\n", "more than 18 digits"),
    "hexadecimal": (b"version: 0x" + b"f" * 100_000 + b"\n", "more than 18 digits"),
    "decimal": (b"version: " + b"9" * 5_000 + b"\n", "more than 18 digits"),
    # PyYAML keeps the last of two equal keys: a second default: {} made a policy trust-all
    "duplicate-top": (b"version: 1\ndefault: {classes: [normal]}\ndefault: {}\n", "'default'"),
    "duplicate-nested": (
        b"version: 1\nrules:\n  - match: {name: x}\n    classes: [normal]\n"
        b"    classes: [real-time]\n",
        "the key 'classes' is given twice in one mapping (line 5)",
    ),
    "duplicate-flow": (b"default: {slo: false, slo: true}\n", "'slo' is given twice"),
    "duplicate-same-value": (b"a: 1\nb: 2\na: 1\n", "'a' is given twice"),
    "duplicate-equal-keys": (b"1: a\n0x1: b\n", "'1' is given twice"),
}


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_yaml_is_one_line(tmp_path: Path, case: str) -> None:
    data, needle = HOSTILE[case]
    path = _write(tmp_path, "doc.yml", data)
    with pytest.raises(ConfigError) as err:
        loader.read_yaml(path, "--x")
    assert str(err.value).startswith(f"--x {path}: ")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_size_is_bounded_before_anything_is_parsed(tmp_path: Path) -> None:
    path = _write(tmp_path, "big.yml", b"# " + b"x" * loader.MAX_BYTES + b"\n")
    with pytest.raises(ConfigError, match=r"cannot read: larger than 4194304 bytes"):
        loader.read_yaml(path, "--rules.actions")
    small = _write(tmp_path, "small.yml", b"a: 1\n" * 100)
    with pytest.raises(ConfigError, match=r"cannot read: larger than 100 bytes"):
        loader.read_yaml(small, "--x", limit=100)
    for special in ("/dev/zero", "/proc/self"):
        with pytest.raises(ConfigError, match="not a regular file"):
            loader.read_yaml(special, "--x")


def test_within_the_limits_yaml_reads_as_pyyaml_reads_it() -> None:
    text = (
        "version: 1\nint: 999999999999999999\nneg: -0x10\nsexa: 1:30\nf: 1.5e3\n"
        "anchored: &a {k: [1, 2]}\nagain: *a\nmerged: {<<: *a, j: 3}\nover: {<<: *a, k: 9}\n"
        "when: 2024-01-02\n" + "deep: " + "[" * 60 + "]" * 60 + "\n"
    )
    assert loader.parse_yaml(text, "--x") == yaml.safe_load(text)
    for path in sorted((PACKAGE / "rules").glob("*.yml")):
        assert loader.read_yaml(path, "--rules.files") == yaml.safe_load(path.read_text())


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested more than 64 deep"),
        ("[" * 65 + "]" * 65, "nested more than 64 deep"),
        ('{"a": ' + "1" * 19 + "}", "more than 18 digits"),
        ("[NaN]", "NaN is not a number JSON allows"),
        ("[-Infinity]", "-Infinity is not a number JSON allows"),
        ("[" + "0," * 300_000 + "0]", "more than 250000 values"),
        ("{", "invalid JSON: Expecting property name"),
        ('{"a": {"b": 1, "b": 2}}', "the key 'b' is given twice in one object"),
    ],
    ids=["deep", "65", "big-int", "nan", "inf", "many", "broken", "duplicate"],
)
def test_hostile_json_is_one_line(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        loader.parse_json(text, "--profile p.json")
    assert str(err.value).startswith("--profile p.json: invalid JSON: ")
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert loader.parse_json('{"a": [1, 2.5, "x", null, true]}', "-") == {
        "a": [1, 2.5, "x", None, True]
    }


def _run(entry: Callable[[list[str]], int], argv: list[str]) -> int:
    try:
        return entry(argv)
    except SystemExit as exited:
        return int(exited.code or 0)


#: Every flag that names a document, and the command that reads it: (entry, argv before the
#: file, prog as its errors start, the flag).
READERS: dict[str, tuple[Callable[[list[str]], int], list[str], str, str]] = {
    "trust-policy": (gpuguard_main, ["exporter", "--trust.policy-file"], "gpuguard exporter",
                     "--trust.policy-file"),
    "config-file": (gpuguard_main, ["placer", "--config.file"], "gpuguard placer",
                    "--config.file"),
    "web-config": (gpuguard_main, ["exporter", "--web.config.file"], "gpuguard exporter",
                   "--web.config.file"),
    "client-config": (gpuguard_main, ["placer", "--prometheus.http-config-file"],
                      "gpuguard placer", "--prometheus.http-config-file"),
    "actions": (gpuguard_main, ["actuator", "--web.insecure", "--rules.actions"],
                "gpuguard actuator", "--rules.actions"),
    "profile": (gpusim_main, ["serve", "--profile"], "gpusim", "--profile"),
}  # fmt: skip


#: (reader, case): every reader gets the cheap cases; the costly deep flow (about 1 s: PyYAML
#: scans 1,024 characters ahead for a possible key at each level) only the trust policy.
READER_CASES = [
    *((r, c) for r in sorted(READERS)
      for c in ("deep-block", "not-utf8", "laughs", "sexagesimal", "huge", "duplicate-top")),
    ("trust-policy", "deep-flow"),
]  # fmt: skip


@pytest.mark.parametrize(("reader", "case"), READER_CASES)
def test_every_reader_exits_2_with_one_line(
    reader: str,
    case: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The issue's hostile trust-policy files (deep YAML, not UTF-8, huge) and two more, given
    to every command through every flag that names a document."""
    monkeypatch.chdir(tmp_path)
    entry, argv, prog, flag = READERS[reader]
    data = b"x: 1\n" * (1 << 20) if case == "huge" else HOSTILE[case][0]
    path = _write(tmp_path, "given.json" if reader == "profile" else "given.yml", data)
    status = _run(entry, [*argv, str(path)])
    out, err = capsys.readouterr()
    assert status == 2, err
    assert out == "" and err.count("\n") == 1, err
    prefix = f"{prog}: error: " if entry is gpusim_main else f"{prog}: "
    assert err.startswith(f"{prefix}{flag} {path}: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # nothing made


def test_a_workload_trace_goes_through_the_loader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _write(tmp_path, "trace.jsonl", b'{"t": 0}\n{"t": ' + b"[" * 5000 + b"\n")
    argv = ["server", "--trace", str(trace), "--socket", str(tmp_path / "none.sock")]
    assert _run(workload_main, argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"gpusim.workload: error: --trace {trace}: trace line 2: invalid JSON: nested more "
        "than 64 deep\n"
    )
    _write(tmp_path, "trace.jsonl", b"\xff\n")
    assert _run(workload_main, argv) == 2
    assert capsys.readouterr().err.startswith(f"gpusim.workload: error: --trace {trace}: cannot")


def test_only_the_loader_parses_yaml() -> None:
    """A new reader cannot go round the limits: ``yaml.safe_load`` and ``json.load`` (of a
    file) appear in the loader alone."""
    banned = {("yaml", n) for n in ("load", "safe_load", "safe_load_all", "load_all", "full_load")}
    banned |= {("json", "load")}
    found = []
    for path in _package_modules(PACKAGE):
        if path == PACKAGE / "loader.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and (node.value.id, node.attr) in banned
            ):
                where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
                found.append(f"{where} {node.value.id}.{node.attr}")
    assert not found, found


def _package_modules(directory: Path) -> list[Path]:
    """The package's modules, through the links to the design's top-level folders."""
    found = sorted(directory.glob("*.py"))
    for child in sorted(directory.iterdir()):
        if child.is_dir() and (child / "__init__.py").is_file():
            found += _package_modules(child)
    return found
