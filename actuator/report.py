"""What one trigger led to: the actions and skips a webhook caller gets back as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Report:
    """What one trigger led to (returned to webhook callers as JSON)."""

    actions: list[dict[str, Any]] = field(default_factory=list)
    skips: list[dict[str, Any]] = field(default_factory=list)
    docker_down: bool = False
    exporter_down: bool = False

    def merge(self, other: Report) -> None:
        self.actions += other.actions
        self.skips += other.skips
        self.docker_down |= other.docker_down
        self.exporter_down |= other.exporter_down

    def to_doc(self) -> dict[str, Any]:
        return {"actions": self.actions, "skips": self.skips}
