"""One duration grammar and one byte-size grammar (gpuguard/units.py), read by labels, policy
files, flags, the placer's query and its kube-scheduler extender alike."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest
import yaml

from gpuguard import flags, labels, units
from gpuguard.exporter import trust
from gpuguard.exporter.config import add_flags, load_config
from gpuguard.loader import ConfigError
from gpuguard.placer import extender
from gpuguard.placer.errors import BadRequest
from gpuguard.placer.query import parse_memory, parse_query
from gpuguard.placer.ranking import Request

GIB = 2**30
#: Go's time.ParseDuration forms (Kubernetes' metav1.Duration): what every reader takes.
GO_DURATIONS = [("9s", 9.0), ("1500ms", 1.5), ("2m", 120.0), ("1m30s", 90.0), ("0.5s", 0.5),
                ("1h2m3.5s", 3723.5), ("250us", 250e-6), ("20000000ns", 0.02)]  # fmt: skip
#: Spellings no reader takes: spaces, a point without digits on both sides, exponents,
#: signs, units Go does not know, case.
REFUSED = ["9 s", " 9s", "9s ", ".5s", "5.s", "1e3s", "+9s", "-9s", "9S", "9sec", "2d",
           "1m 30s", "ms", "", "9s\n", "\u0669s", "nan", "inf", "1µs"]  # fmt: skip


@pytest.mark.parametrize(("text", "seconds"), GO_DURATIONS)
def test_every_reader_takes_go_durations(text: str, seconds: float) -> None:
    assert units.parse_duration(text) == pytest.approx(seconds)
    assert labels.parse_duration(text) == pytest.approx(seconds)
    assert flags.duration({"d": text}, "d") == pytest.approx(seconds)
    policy = trust.parse_policy({"version": 1, "default": {"min_deadline": text}})
    assert policy.default.min_deadline_s == pytest.approx(seconds)
    if seconds >= 0.01:
        asked = parse_query(f"deadline={text}&memory=1").request.deadline_s
        assert asked == pytest.approx(seconds)


@pytest.mark.parametrize("text", REFUSED)
def test_every_reader_refuses_the_same_spellings(text: str) -> None:
    with pytest.raises(units.UnitError):
        units.parse_duration(text, bare_seconds=True)
    with pytest.raises(labels.LabelError):
        labels.parse_duration(text)
    with pytest.raises(ConfigError, match=r"^--d: invalid duration"):
        flags.duration({"d": text}, "d")
    with pytest.raises(ValueError, match=r"^default\.min_deadline: "):
        trust.parse_policy({"version": 1, "default": {"min_deadline": text}})
    with pytest.raises(BadRequest):
        parse_query("deadline=" + text.replace(" ", "+").replace("\n", "%0A") + "&memory=1")


def test_a_bare_number_is_seconds_in_labels_only() -> None:
    """Container labels document ``9`` (seconds); flags, policy files and the placer's query
    need a unit, so ``1`` there is refused, not guessed."""
    assert labels.parse_duration("9") == 9.0 and labels.parse_duration("0.5") == 0.5
    assert units.parse_duration("9", bare_seconds=True) == 9.0
    with pytest.raises(units.UnitError):
        units.parse_duration("9")
    with pytest.raises(ConfigError, match=r"^--d: invalid duration '1': write digits and a unit"):
        flags.duration({"d": "1"}, "d")
    for given in ("1", 1, 1.0):
        with pytest.raises(ValueError, match=r"^default\.min_deadline: "):
            trust.parse_policy({"version": 1, "default": {"min_deadline": given}})
    with pytest.raises(BadRequest, match=r"^deadline '9': write digits and a unit"):
        parse_query("deadline=9&memory=1")


def test_a_yaml_number_in_a_config_file_is_still_seconds(tmp_path: Path) -> None:
    """``--config.file``'s ``record.window: 30`` (a YAML number, not text) kept its meaning;
    on the command line the same flag needs its unit."""
    assert flags.duration({"d": 2}, "d") == 2.0 and flags.duration({"d": 0.25}, "d") == 0.25
    for bad in (0, -1, math.inf, math.nan, True):
        with pytest.raises(ConfigError, match=r"^--d: invalid duration"):
            flags.duration({"d": bad}, "d")
    parser = argparse.ArgumentParser()
    add_flags(parser)
    config_file = tmp_path / "exporter.yml"
    config_file.write_text("poll.interval: 0.25\n")
    config = load_config(parser.parse_args([f"--config.file={config_file}"]), env={})
    assert config.poll_interval_s == 0.25
    with pytest.raises(ConfigError, match=r"^--poll\.interval: invalid duration '0\.25'"):
        load_config(parser.parse_args(["--poll.interval=0.25"]), env={})


def test_zero_is_well_formed_but_no_duration() -> None:
    for text in ("0s", "0ms", "0.0s", "0h0m"):
        with pytest.raises(units.NotPositive):
            units.parse_duration(text)
    with pytest.raises(BadRequest, match=r"^deadline '0s': must be at least 10ms$"):
        parse_query("deadline=0s&memory=1")


@pytest.mark.parametrize("seconds", [9.0, 1.5, 0.5, 0.02, 90.0, 3.6e6, 1e-4, 1e-13, 1234.5678])
def test_format_duration_reads_back(seconds: float) -> None:
    text = units.format_duration(seconds)
    assert units.parse_duration(text) == pytest.approx(seconds, rel=1e-6)


@pytest.mark.parametrize(
    ("text", "size"),
    [("20Gi", 20 * GIB), ("20G", 20 * 10**9), ("512Mi", 512 * 2**20), ("1.5Gi", 3 * GIB // 2),
     ("100k", 100_000), ("2e9", 2 * 10**9), ("1E", 10**18), ("1Ki", 1024), ("0.5", 1),
     ("2GiB", 2 * GIB), ("512MiB", 512 * 2**20), ("1073741824", GIB), ("3GB", 3 * 10**9),
     ("10B", 10)],
)  # fmt: skip
def test_sizes_are_kubernetes_quantities_and_gpuguards_own(text: str, size: int) -> None:
    assert units.parse_bytes(text) == size


@pytest.mark.parametrize(
    "text", ["lots", "", "20 Gi", "20gi", "-1Gi", "+1Gi", ".5Gi", "5.Gi", "100m", "1u", "1e-3",
             "1e100", "2PiB", "20Gi ", "\u0669Gi", "1" * 70]
)  # fmt: skip
def test_sizes_refused(text: str) -> None:
    with pytest.raises(units.UnitError):
        units.parse_bytes(text)


def test_the_placer_takes_kubernetes_quantities_within_its_bounds() -> None:
    assert parse_query("deadline=9s&memory=20Gi").request.memory_bytes == 20 * GIB
    assert parse_memory("1Pi") == 2**50
    with pytest.raises(BadRequest, match=r"^memory '2Pi': must be more than 0 and at most"):
        parse_memory("2Pi")
    with pytest.raises(BadRequest, match=r"^memory: invalid size '20 Gi'"):
        parse_memory("20 Gi")


def _pod(pod_labels: dict[str, str]) -> extender.ExtenderArgs:
    return extender.ExtenderArgs("ns/p", pod_labels, {}, ("n1",))


@pytest.mark.parametrize(
    ("declared", "request_"),
    [
        ({"gpuguard.deadline": "1m30s", "gpuguard.memory": "20Gi"}, Request(90.0, 20 * GIB)),
        ({"gpuguard.deadline": "9s", "gpuguard.memory": "20G"}, Request(9.0, 20 * 10**9)),
        ({"gpuguard.deadline": "9", "gpuguard.memory": "512Mi", "gpuguard.runtime": "1m"},
         Request(9.0, 512 * 2**20, runtime_s=60.0)),
    ],
)  # fmt: skip
def test_the_extender_reads_kubernetes_spellings(
    declared: dict[str, str], request_: Request
) -> None:
    """A pod's own spellings, as Kubernetes writes quantities and durations, are declarations
    the extender can rank (they were refused, and the pod stayed Pending)."""
    assert extender.declared_request(_pod(declared)) == request_


def test_the_extender_says_why_a_declaration_cannot_be_read() -> None:
    """Every node fails, unresolvable, with the same one-line reason: kube-scheduler's
    FitError counts identical reasons into the FailedScheduling event ("0/N nodes are
    available: N gpuguard: gpuguard.memory: invalid size '20 Gi': ...")."""
    args = extender.ExtenderArgs("ns/p", {"gpuguard.deadline": "9s", "gpuguard.memory": "20 Gi"},
                                 {}, ("n1", "n2"))  # fmt: skip
    with pytest.raises(extender.DeclarationError) as err:
        extender.declared_request(args)
    assert str(err.value).startswith("gpuguard.memory: invalid size '20 Gi': ")
    verdicts = extender.everywhere(args.node_names, f"gpuguard: {err.value}")
    result = extender.filter_result(args, verdicts)
    assert result["NodeNames"] == [] and result["FailedNodes"] == {}
    assert set(result["FailedAndUnresolvableNodes"].values()) == {f"gpuguard: {err.value}"}


def test_policy_files_read_their_durations_with_the_one_grammar() -> None:
    doc = yaml.safe_load("version: 1\ndefault: {min_deadline: 1m30s}")
    assert trust.parse_policy(doc).default.min_deadline_s == 90.0
