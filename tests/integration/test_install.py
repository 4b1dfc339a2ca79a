"""``pip install .`` gives one ``gpuguard`` namespace that works outside the source tree."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.standalone

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import json, sys
from pathlib import Path
import gpuguard
from gpuguard import resources
from gpuguard.actuator.configfiles import load_actions
actions = load_actions(resources.ACTIONS_FILE, resources.RULE_FILES_GLOB)
print(json.dumps({
    "package": str(Path(gpuguard.__file__).parent),
    "actions": len(actions),
    "prometheus": (resources.PROMETHEUS_DIR / "prometheus-fast.yml").is_file(),
    "alertmanager": (resources.ALERTMANAGER_DIR / "alertmanager.yml").is_file(),
    "dashboards": len(list(resources.DASHBOARDS_DIR.glob("*.json"))),
}))
"""


def test_wheel_installs_one_namespace_with_its_data(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("gpuguard-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"gpuguard"}

    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), wheel],
        check=True,
        capture_output=True,
    )
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["package"] == str(target / "gpuguard")  # not the source tree
    assert doc["actions"] >= 8 and doc["prometheus"] and doc["alertmanager"]
    assert doc["dashboards"] >= 4
    version = subprocess.run(
        [sys.executable, "-m", "gpuguard.cli", "--version"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert version.returncode == 0 and version.stdout.startswith("gpuguard "), version.stderr


def test_make_setup_is_quiet_about_the_editable_install(tmp_path: Path) -> None:
    """A newcomer's first command prints no setuptools warning block (issue 19)."""
    venv = tmp_path / "venv"
    out = subprocess.run(
        ["make", "-s", "-C", str(REPO), f"VENV={venv}", "setup"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (venv / "bin" / "gpuguard").exists()
    text = out.stdout + out.stderr
    assert "same name" not in text and "Editable installation" not in text, text[-3000:]
