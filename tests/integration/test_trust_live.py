"""The operator's trust policy on a running exporter and the private engine: a tenant's
real-time claim and queue-jumping deadline are rejected, counted and shown; a container the
policy trusts keeps its claim (docs/security.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from exporter_support import ExporterProcess

from tests.waiting import wait_for

pytestmark = pytest.mark.integration

POLICY = """
version: 1
default:
  classes: [normal, best-effort]
  min_deadline: 1s
rules:
  - match: {name: "trusted-*"}
    classes: [real-time, normal, best-effort]
    min_deadline: 10ms
"""
CLAIM = {"gpuguard.class": "real-time", "gpuguard.deadline": "0.0000000001ms"}


@pytest.fixture
def exporter_flags(tmp_path: Path) -> tuple[str, ...]:
    path = tmp_path / "trust.yml"
    path.write_text(POLICY)
    return (f"--trust.policy-file={path}",)


def test_claims_beyond_the_policy_are_rejected_counted_and_shown(
    exporter: ExporterProcess, docker_client: Any, base_image: str
) -> None:
    names = ("tenant-claims", "trusted-server")
    try:
        for name in names:
            labels = {**CLAIM, "gpuguard.deadline": "50ms"} if name.startswith("trusted") else CLAIM
            docker_client.containers.run(
                base_image, ["sleep", "60"], name=name, labels=labels, detach=True,
                network_mode="none",
            )  # fmt: skip

        def containers() -> dict[str, Any] | None:
            found = {c["name"]: c for c in exporter.state()["containers"]}
            return found if set(names) <= set(found) else None

        found = wait_for(containers, timeout=20, interval=0.05, what="both containers")
        tenant, trusted = found["tenant-claims"], found["trusted-server"]
        assert (tenant["class"], tenant["deadline_s"]) == ("normal", 1.0)
        assert {r["label"] for r in tenant["claims_rejected"]} == {
            "gpuguard.class", "gpuguard.deadline",
        }  # fmt: skip
        assert (trusted["class"], trusted["deadline_s"], trusted["claims_rejected"]) == (
            "real-time", 0.05, [],
        )  # fmt: skip
        text = exporter.metrics_text()
        rejected = [
            line for line in text.splitlines()
            if line.startswith("gpuguard_container_claim_rejected{")
        ]  # fmt: skip
        assert len(rejected) == 2 and all('container="tenant-claims"' in r for r in rejected)
    finally:
        for name in names:
            for c in docker_client.containers.list(all=True, filters={"name": name}):
                c.remove(force=True)
