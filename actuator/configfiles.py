"""What the actuator's flags name, read and checked once at start-up: the alert actions and
the rule files, the state directory, the token file, host paths and engine URLs. Anything
wrong is one ``ConfigError`` line.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from gpuguard import files, flags
from gpuguard.actuator.errors import ConfigError
from gpuguard.actuator.safety.journal import JOURNAL_FILE
from gpuguard.contract import AlertAction

ACTIONS = tuple(AlertAction)


@flags.reraise_as(ConfigError)
def load_actions(actions_path: Path, rules_glob: str) -> dict[str, AlertAction]:
    """Read ``rules/actions.yml`` and check it against the alerts of the rule files."""
    doc = flags.read_yaml(actions_path, "--rules.actions")
    if not isinstance(doc, dict) or not isinstance(doc.get("actions"), dict):
        raise ConfigError(
            f"--rules.actions {actions_path}: needs a mapping 'actions: {{ALERT: ACTION}}'"
        )
    actions: dict[str, AlertAction] = {}
    for alert, action in doc["actions"].items():
        if action not in ACTIONS:
            raise ConfigError(
                f"--rules.actions {actions_path}: unknown action {action!r} for {alert} "
                f"(known: {', '.join(ACTIONS)})"
            )
        actions[str(alert)] = AlertAction(action)
    known = rule_alert_names(rules_glob)
    unknown = sorted(set(actions) - known)
    if unknown:
        raise ConfigError(
            f"--rules.actions {actions_path}: unknown alert name(s) {', '.join(unknown)} "
            f"(not an 'alert:' in {rules_glob})"
        )
    return actions


@flags.reraise_as(ConfigError)
def rule_alert_names(rules_glob: str) -> set[str]:
    """Every ``alert:`` name in the Prometheus rule files matching ``rules_glob``."""
    paths = sorted(glob.glob(rules_glob))
    if not paths:
        raise ConfigError(f"--rules.files {rules_glob}: no rule files match")
    names: set[str] = set()
    for path in paths:
        doc = flags.read_yaml(Path(path), "--rules.files")
        groups = doc.get("groups") if isinstance(doc, dict) else None
        if not isinstance(groups, list):
            raise ConfigError(f"--rules.files {path}: not a Prometheus rule file (no groups)")
        for group in groups:
            for rule in (group or {}).get("rules") or []:
                if isinstance(rule, dict) and "alert" in rule:
                    names.add(str(rule["alert"]))
    return names


def private_state_dir(state_dir: Path, warnings: list[str]) -> Path:
    """Create ``--state.dir`` with mode 0700 (or narrow it to 0700): the journal and audit
    log name every tenant container. Shared by the actuator and the guard.

    Writability is proven by creating a file there, not guessed from the mode (root passes
    every ``access`` check, and ``/proc`` looks writable until a file is made in it); the
    mode is changed through the open directory, never through a path that could be a link.
    A directory that cannot be written but holds a journal is a warning, not an error: the
    pauses it names must still be resumed (a full or read-only disk), and nothing is paused
    until it can be written.
    """
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"--state.dir {state_dir}: cannot create: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode & 0o777
        if mode & 0o077:
            try:
                os.fchmod(fd, 0o700)
            except OSError as exc:
                warnings.append(
                    f"--state.dir {state_dir}: mode {mode:o}, cannot make it 0700: {exc.strerror}"
                )
    finally:
        os.close(fd)
    probe = state_dir / f".gpuguard-probe-{os.getpid()}"
    try:
        os.close(files.open_state_file(probe, os.O_WRONLY | os.O_EXCL))
        os.unlink(probe)
    except OSError as exc:
        if not os.path.lexists(state_dir / JOURNAL_FILE):
            raise ConfigError(f"--state.dir {state_dir}: not writable: {exc.strerror}") from None
        warnings.append(
            f"--state.dir {state_dir}: not writable ({exc.strerror}): resuming what its "
            "journal names; nothing is paused or recorded there until it can be written"
        )
    return state_dir


def token_file(path: Any, insecure: bool) -> str | None:
    if not path:
        if insecure:
            return None
        raise ConfigError(
            "--web.token-file is required (or --web.config.file with basic_auth_users or "
            "verified client certificates, or --web.insecure for loopback only)"
        )
    return flags.read_token(path)


def host_path(values: Mapping[str, Any], name: str) -> Path:
    """A directory of the host's (``--path.procfs``, ``--path.sysfs``); shared with the guard."""
    path = Path(str(values[name]))
    if not path.is_dir():
        raise ConfigError(f"--{name} {values[name]!r}: not a directory")
    return path


def containerd_address(values: Mapping[str, Any]) -> str | None:
    value = values.get("containerd.address")
    if value in (None, ""):
        return None
    if not str(value).removeprefix("unix://").startswith("/"):
        raise ConfigError(f"--containerd.address {value!r}: must be a socket path or unix://PATH")
    return str(value)


def engine_url(values: Mapping[str, Any], name: str) -> str | None:
    value = values[name]
    if value in (None, ""):
        return None
    parsed = urlparse(str(value))
    if parsed.scheme not in ("unix", "tcp", "http", "https", "ssh"):
        raise ConfigError(f"--{name} {value!r}: must be unix://PATH or tcp://HOST:PORT")
    return str(value)
