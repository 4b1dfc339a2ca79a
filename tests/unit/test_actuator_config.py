"""Flag validation: every bad value is one clear line and exit status 2."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from gpuguard import flags
from gpuguard.actuator.config import add_flags, load_config
from gpuguard.actuator.configfiles import load_actions
from gpuguard.actuator.decision import RateLaw
from gpuguard.actuator.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
RULES = """
groups:
  - name: g
    rules:
      - record: x:y
        expr: vector(1)
      - alert: GpuguardGpuSaturatedContention
        expr: vector(1)
      - alert: GpuguardTaskDeadlineAtRisk
        expr: vector(1)
"""


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "a.rules.yml").write_text(RULES)
    (tmp_path / "actions.yml").write_text(
        "version: 1\nactions:\n"
        "  GpuguardGpuSaturatedContention: admission\n  GpuguardTaskDeadlineAtRisk: mark_node\n"
    )
    (tmp_path / "token").write_text("s3cret\n")
    return {
        "rules": str(tmp_path / "*.rules.yml"),
        "actions": str(tmp_path / "actions.yml"),
        "token": str(tmp_path / "token"),
        "state": str(tmp_path / "state"),
        "dir": str(tmp_path),
    }


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args(argv)


def base(files: dict[str, str]) -> list[str]:
    return [
        f"--rules.files={files['rules']}",
        f"--rules.actions={files['actions']}",
        f"--web.token-file={files['token']}",
        f"--state.dir={files['state']}",
    ]


def test_defaults(files: dict[str, str]) -> None:
    config = load_config(parse(base(files)))
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 10836)
    assert config.token == "s3cret"
    assert config.exporter_url == "http://127.0.0.1:10835"
    assert config.exporter_timeout_s == 5.0
    assert config.mode == "both"
    assert config.policy.order == "fifo"
    assert config.policy.max_actions == 10
    assert config.policy.input_timeout_s == 5.0
    assert config.policy.memory_threshold == 0.95
    assert config.max_pause_s == 120.0
    assert config.actions == {
        "GpuguardGpuSaturatedContention": "admission",
        "GpuguardTaskDeadlineAtRisk": "mark_node",
    }
    assert config.alerts_for("mark_node") == {"GpuguardTaskDeadlineAtRisk"}
    assert not config.dry_run and config.docker_host is None and config.node_name
    assert config.pause_method == "cgroup"
    assert (config.procfs, config.sysfs) == (Path("/proc"), Path("/sys"))


def test_the_host_paths_and_the_pause_method(files: dict[str, str], tmp_path: Path) -> None:
    argv = [*base(files), "--pause.method=docker", f"--path.procfs={tmp_path}",
            f"--path.sysfs={tmp_path}"]  # fmt: skip
    config = load_config(parse(argv))
    assert (config.pause_method, config.procfs, config.sysfs) == ("docker", tmp_path, tmp_path)


def test_flags_override_the_config_file(files: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "conf.yml").write_text("policy.order: edf\nmax-pause: 30s\nmode: fast\n")
    args = parse([*base(files), f"--config.file={tmp_path / 'conf.yml'}", "--mode=webhook"])
    config = load_config(args)
    assert config.policy.order == "edf" and config.max_pause_s == 30.0 and config.mode == "webhook"


def test_a_best_effort_period_longer_than_max_pause_warns(files: dict[str, str]) -> None:
    rate = load_config(parse([*base(files), "--besteffort.period=3m"])).warnings
    assert any("--besteffort.period: it will be released" in w for w in rate), rate
    assert not [w for w in load_config(parse(base(files))).warnings if "max-pause" in w]
    edges = load_config(parse([*base(files), "--max-pause=5s"])).warnings
    assert any("longest freeze on busy edges" in w for w in edges), edges


@pytest.mark.parametrize(
    "flag",
    [
        "--policy.best-effort-min-share=0.3",
        "--policy.best-effort-window=1h",
        "--policy.slo-best-effort-min-share=0",
        "--policy.best-effort-hold=1s",
        "--policy.best-effort-hold-max=8s",
        "--policy.best-effort-coexist-demand=0.2",
        "--policy.best-effort-control=hold",
    ],
)
def test_a_retired_hold_flag_warns_in_one_line_naming_its_replacement_and_changes_nothing(
    files: dict[str, str], flag: str
) -> None:
    config = load_config(parse([*base(files), flag]))
    assert config.policy == load_config(parse(base(files))).policy
    [warning] = [w for w in config.warnings if "is retired" in w]
    assert warning.startswith(flag.split("=")[0]) and "\n" not in warning
    assert "busy edges" in warning and "rate control" in warning


def test_a_retired_flag_in_the_config_file_warns_too(files: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "conf.yml").write_text("policy.best-effort-hold: 300ms\n")
    config = load_config(parse([*base(files), f"--config.file={tmp_path / 'conf.yml'}"]))
    assert [w.split()[0] for w in config.warnings if "is retired" in w] == [
        "--policy.best-effort-hold"
    ]


def test_insecure_binds_loopback_whatever_the_address(files: dict[str, str]) -> None:
    argv = [a for a in base(files) if "token" not in a]
    config = load_config(parse([*argv, "--web.insecure", "--web.listen-address=0.0.0.0:9999"]))
    assert config.listen_host == "127.0.0.1" and config.listen_port == 9999
    assert config.token is None
    assert "binding 127.0.0.1 instead of 0.0.0.0" in config.warnings[0]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--web.listen-address=nonsense"], "--web.listen-address 'nonsense': use host:port"),
        (["--exporter.url=ftp://x"], "--exporter.url 'ftp://x': must be an http/https URL"),
        (["--exporter.timeout=soon"], "--exporter.timeout: invalid duration 'soon'"),
        (["--mode=sometimes"], "--mode 'sometimes': must be one of webhook, fast, both"),
        (["--policy.order=lifo"], "--policy.order 'lifo': must be one of fifo, edf"),
        (["--policy.max-actions=0"], "--policy.max-actions '0': must be >= 1"),
        (["--policy.max-actions=many"], "must be an integer"),
        (["--policy.memory-threshold=1.5"], "must be in (0, 1]"),
        (["--max-pause=0s"], "--max-pause: invalid duration '0s': must be greater than zero"),
        (["--docker.host=docker.sock"], "--docker.host 'docker.sock': must be unix://PATH"),
        (["--log.level=loud"], "--log.level 'loud'"),
        (["--besteffort.floor=nan"], "--besteffort.floor 'nan'"),
        (["--besteffort.floor=some"], "must be a number"),
        (["--besteffort.period=0"], "--besteffort.period: invalid duration"),
        (["--policy.best-effort-control=duty"], "--policy.best-effort-control 'duty'"),
        (["--pause.method=sigstop"], "--pause.method 'sigstop': must be one of cgroup, docker"),
        (["--path.procfs=/no/such/proc"], "--path.procfs '/no/such/proc': not a directory"),
        (["--path.sysfs=/no/such/sys"], "--path.sysfs '/no/such/sys': not a directory"),
    ],
)
def test_bad_values(files: dict[str, str], extra: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(parse([*base(files), *extra]))
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_token_is_required_unless_insecure(files: dict[str, str], tmp_path: Path) -> None:
    argv = [a for a in base(files) if "token" not in a]
    with pytest.raises(ConfigError, match=r"--web\.token-file is required"):
        load_config(parse(argv))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(parse([*argv, f"--web.token-file={tmp_path / 'empty'}"]))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(parse([*argv, f"--web.token-file={tmp_path / 'missing'}"]))


@pytest.mark.parametrize(
    ("actions", "needle"),
    [
        (
            "version: 1\nactions:\n  GpuguardGpuSaturatedContention: reboot\n",
            "unknown action 'reboot'",
        ),
        ("version: 1\nactions:\n  NoSuchAlert: record\n", "unknown alert name(s) NoSuchAlert"),
        ("version: 1\n", "needs a mapping 'actions:"),
        ("actions: [oops\n", "invalid YAML"),
    ],
)
def test_bad_actions_file(files: dict[str, str], actions: str, needle: str) -> None:
    Path(files["actions"]).write_text(actions)
    with pytest.raises(ConfigError) as err:
        load_config(parse(base(files)))
    assert needle in str(err.value)


def test_rule_files_must_exist(files: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="no rule files match"):
        load_actions(Path(files["actions"]), files["dir"] + "/nothing/*.yml")


def test_unknown_config_file_setting(files: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "conf.yml").write_text("policy.oder: edf\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config(parse([*base(files), f"--config.file={tmp_path / 'conf.yml'}"]))


def test_the_shipped_actions_match_the_shipped_rules() -> None:
    actions = load_actions(REPO / "rules" / "actions.yml", str(REPO / "rules" / "*.rules.yml"))
    assert actions["GpuguardGpuSaturatedContention"] == "admission"
    assert actions["GpuguardGpuMemoryPressure"] == "admission"
    assert actions["GpuguardGpuIdleWhileTasksWait"] == "admission"
    assert actions["GpuguardTaskDeadlineAtRisk"] == "mark_node"
    assert actions["GpuguardNodeCannotGuaranteeDeadlines"] == "mark_node"
    assert actions["GpuguardTaskDeadlineOverrun"] == "record"
    assert actions["GpuguardExporterDown"] == "resume_all"


def test_cli_prints_one_line_and_exits_2(files: dict[str, str], capsys: Any) -> None:
    from gpuguard.cli import main

    status = main(["actuator", *base(files), "--policy.order=lifo"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("gpuguard actuator: --policy.order")


def test_state_dir_audit_log_and_token_permissions(tmp_path: Path) -> None:
    from gpuguard.actuator.audit import AuditLog
    from tests.unit.actuator_support import actuator_config

    state = tmp_path / "state"
    config = actuator_config(tmp_path)
    assert state.stat().st_mode & 0o777 == 0o700  # the journal names every tenant
    assert not any("token" in w for w in config.warnings)
    state.chmod(0o755)  # made by hand, or by an image, wider than it should be
    (tmp_path / "token").write_text("t0ken")
    (tmp_path / "token").chmod(0o644)
    config = actuator_config(tmp_path)
    assert state.stat().st_mode & 0o777 == 0o700
    assert any("every user of this host can read the token" in w for w in config.warnings)
    (tmp_path / "token").chmod(0o640)  # a group that needs it (Alertmanager) is fine
    assert not any("token" in w for w in actuator_config(tmp_path).warnings)
    audit = AuditLog(state / "audit.jsonl")
    audit.write("start")
    audit.close()
    assert (state / "audit.jsonl").stat().st_mode & 0o777 == 0o600
    (state / "audit.jsonl").chmod(0o644)
    AuditLog(state / "audit.jsonl").close()
    assert (state / "audit.jsonl").stat().st_mode & 0o777 == 0o600


def test_guard_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuguard.actuator.guard import program as guard
    from gpuguard.cli import build_parser

    def config(*argv: str) -> guard.GuardConfig:
        args = build_parser().parse_args(["guard", *argv])
        return guard.validate(flags.merge(args, guard.FLAGS))

    made = config(f"--state.dir={tmp_path / 'g'}", "--max-pause=30s")
    assert (made.max_pause_s, made.lease_timeout_s) == (30.0, 15.0)
    assert (made.procfs, made.sysfs) == (Path("/proc"), Path("/sys"))
    assert (tmp_path / "g").stat().st_mode & 0o777 == 0o700
    assert config(f"--state.dir={tmp_path / 'g'}", f"--path.sysfs={tmp_path}").sysfs == tmp_path
    for bad in ("--max-pause=soon", "--lease.timeout=-1s", "--docker.host=ftp://x",
                "--path.procfs=/no/such/proc"):  # fmt: skip
        with pytest.raises(ConfigError):
            config(f"--state.dir={tmp_path / 'bad'}", bad)
        assert not (tmp_path / "bad").exists()  # a bad flag changes nothing
    args = build_parser().parse_args(["guard", "--max-pause=soon"])
    assert args.func(args) == 2
    assert capsys.readouterr().err.startswith("gpuguard guard: --max-pause")


def test_node_name_must_be_one_name(files: dict[str, str], tmp_path: Path) -> None:
    # Issue 20: `node.name: [a, b]` silently became the string "['a', 'b']".
    conf = tmp_path / "conf.yml"
    conf.write_text("node.name: [a, b]\n")
    with pytest.raises(ConfigError, match=r"node\.name must be a single value"):
        load_config(parse([*base(files), f"--config.file={conf}"]))
    with pytest.raises(ConfigError, match=r"^--node.name "):
        load_config(parse([*base(files), "--node.name=a\nb"]))


@pytest.mark.parametrize(
    "argv",
    [
        ["guard", "--state.dir=/proc"],
        ["guard", "--state.dir=/proc/self"],
        ["guard", "--config.file=/dev/zero"],
        ["actuator", "--state.dir=/proc", "--web.insecure"],
        ["actuator", "--web.token-file=/dev/zero"],
        ["actuator", "--web.insecure", "--rules.actions=/dev/zero"],
        ["actuator", "--web.insecure", "--max-pause=9s\n"],
        ["actuator", "--web.insecure", "--policy.max-actions=" + "9" * 5000],
        ["placer", "--web.token-file=/dev/zero"],
        ["exporter", "--config.file=/dev/zero"],
    ],
)
def test_hostile_flags_are_one_line_and_exit_2(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuguard.cli import main

    if argv[0] == "actuator" and not any(a.startswith("--state.dir") for a in argv):
        argv = [*argv, f"--state.dir={tmp_path / 'state'}"]
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith(f"gpuguard {argv[0]}: "), err


def test_web_config_with_users_makes_the_token_optional(
    files: dict[str, str], tmp_path: Path
) -> None:
    from tests.support.tlscerts import write_web_config

    no_token = [a for a in base(files) if not a.startswith("--web.token-file")]
    with pytest.raises(ConfigError, match=r"--web\.token-file is required"):
        load_config(parse(no_token))
    web = write_web_config(tmp_path / "web.yml", None, {"alertmanager": "pw"})
    config = load_config(parse([*no_token, f"--web.config.file={web}"]))
    assert config.token is None and config.web is not None and config.web.users
    plain = write_web_config(tmp_path / "plain.yml", None)  # neither users nor client certs
    with pytest.raises(ConfigError, match=r"--web\.token-file is required"):
        load_config(parse([*no_token, f"--web.config.file={plain}"]))


def test_bad_web_and_client_configs_are_config_errors(
    files: dict[str, str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("basic_auth_users: {bob: plain}\n")
    with pytest.raises(ConfigError, match=r"--web\.config\.file .*basic_auth_users\.bob"):
        load_config(parse([*base(files), f"--web.config.file={bad}"]))
    client = tmp_path / "client.yml"
    client.write_text("basic_auth: {username: actuator, password: pw}\n")
    config = load_config(parse([*base(files), f"--exporter.http-config-file={client}"]))
    assert config.exporter_client.username == "actuator"
    assert any("in clear" in w for w in config.warnings)  # http:// exporter.url
    client.write_text("tls_config: {ca: x}\n")
    with pytest.raises(ConfigError, match=r"--exporter\.http-config-file .*tls_config\.ca"):
        load_config(parse([*base(files), f"--exporter.http-config-file={client}"]))


def test_rate_control_flags(files: dict[str, str]) -> None:
    policy = load_config(parse(base(files))).policy
    assert policy.rate == RateLaw()  # the flags' defaults are the law's
    argv = [*base(files), "--policy.best-effort-control=rate", "--besteffort.period=500ms",
            "--besteffort.floor=0.05", "--besteffort.initial=0.2", "--besteffort.gain=0.3",
            "--besteffort.gain-up=0.1", "--besteffort.deadband=0.2", "--besteffort.max-step=0.5",
            "--besteffort.settle=6s", "--besteffort.stale-after=20s",
            "--besteffort.max-slowdown=1.2", "--prometheus.url=http://127.0.0.1:9090/"]  # fmt: skip
    config = load_config(parse(argv))
    law = config.policy.rate
    assert (law.period_s, law.floor, law.initial, law.gain, law.gain_up) == (
        0.5, 0.05, 0.2, 0.3, 0.1,
    )  # fmt: skip
    assert (law.deadband, law.max_step, law.settle_s, law.stale_after_s) == (0.2, 0.5, 6.0, 20.0)
    assert law.max_slowdown == 1.2
    assert law.floor_window_s == 5.0  # ten periods unless given
    window = [*base(files), "--besteffort.floor-window=30s"]
    assert load_config(parse(window)).policy.rate.floor_window_s == 30.0
    off = load_config(parse([*base(files), "--besteffort.max-slowdown=0"])).policy.rate
    assert off.max_slowdown == 0  # open loop at --besteffort.initial
    assert config.prometheus_url == "http://127.0.0.1:9090"
    assert not any("--prometheus.url" in w for w in config.warnings)
    # rate control without a signal runs open loop: no warning (the start log says so)
    blind = load_config(parse(base(files)))
    assert blind.prometheus_url is None
    assert not [w for w in blind.warnings if "prometheus" in w or "best-effort" in w]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--policy.best-effort-control=detect"],
         "--policy.best-effort-control 'detect': must be one of hold, rate"),
        (["--besteffort.period=50ms"], "--besteffort.period '50ms': must be at least 100ms"),
        (["--besteffort.period=often"], "--besteffort.period: invalid duration 'often'"),
        (["--besteffort.floor=1"], "--besteffort.floor '1': must be in [0, 1)"),
        (["--besteffort.initial=0"], "--besteffort.initial '0': must be in (0, 1]"),
        (["--besteffort.floor=0.3", "--besteffort.initial=0.2"],
         "--besteffort.initial must be at least --besteffort.floor"),
        (["--besteffort.floor-window=500ms"],
         "--besteffort.floor-window '500ms': must be at least --besteffort.period"),
        (["--besteffort.floor-window=often"],
         "--besteffort.floor-window: invalid duration 'often'"),
        (["--besteffort.gain=-1"], "--besteffort.gain '-1': must be in (0, 10]"),
        (["--besteffort.gain-up=lots"], "--besteffort.gain-up 'lots': must be a number"),
        (["--besteffort.deadband=1"], "--besteffort.deadband '1': must be in [0, 1)"),
        (["--besteffort.max-step=0"], "--besteffort.max-step '0': must be in (0, 1]"),
        (["--besteffort.settle=0s"], "--besteffort.settle: invalid duration '0s'"),
        (["--besteffort.stale-after=x"], "--besteffort.stale-after: invalid duration 'x'"),
        (["--besteffort.max-slowdown=1"],
         "--besteffort.max-slowdown '1': must be above 1 (1.05: the real-time side at most"),
        (["--besteffort.max-slowdown=0.5"], "--besteffort.max-slowdown '0.5': must be above 1"),
        (["--besteffort.max-slowdown=11"], "--besteffort.max-slowdown '11': must be in (0, 10]"),
        (["--besteffort.max-slowdown=slow"],
         "--besteffort.max-slowdown 'slow': must be a number"),
        (["--prometheus.url=prom:9090"], "--prometheus.url 'prom:9090': must be an http/https"),
        (["--prometheus.http-config-file=/no/such/file"], "--prometheus.http-config-file"),
    ],
)  # fmt: skip
def test_bad_rate_control_values(files: dict[str, str], extra: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(parse([*base(files), *extra]))
    assert needle in str(err.value)
    assert "\n" not in str(err.value)
