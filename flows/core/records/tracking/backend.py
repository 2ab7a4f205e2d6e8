"""The one interface every tracker backend implements, and what each is started with. No
Prefect; no tracker package imported here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from flows.core.records.tracking.config import TrackingSettings

RunStatus = Literal["FINISHED", "FAILED", "KILLED"]
"""How a tracked run ends (MLflow's names): completed, failed or crashed, cancelled."""
LINEAGE_TAG = "whitney_flows.lineage"
"""The tag (and W&B run id, TensorBoard directory) that names a tracked run across the flow
runs that continue it (flows.core.records.tracking.lineage)."""


@dataclass(frozen=True)
class TrackedRunSpec:
    """What a backend starts or continues: the tracked run's lineage key (the same for a
    retried or resumed flow run), its display name, and the settings."""

    key: str
    name: str
    settings: TrackingSettings

    @property
    def directory(self) -> Path:
        """Where the local tracker files go."""
        return Path(self.settings.dir)


class Tracker(Protocol):
    """A started (or continued) tracked run on one backend."""

    def log_params(self, params: Mapping[str, str]) -> None:
        """The run's settings; a setting a continued run already has keeps its first value
        and the new one is recorded beside it."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Facts about the run (its Whitney run, its flow run, its exported adapter)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Numbers at `step` (the cycle)."""

    def log_file(self, name: str, content: bytes) -> None:
        """A file of the run: the learning curves (`.png`), the summary (`.md`), the exported
        adapter's metadata (`.json`)."""

    def finish(self, status: RunStatus) -> None:
        """End the run (a later retry or resume continues it)."""
