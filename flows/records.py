"""What a flow run leaves behind for people: per cycle a table artifact row and a metrics
JSON line, a progress artifact, and a final markdown summary. Never the API key: nothing here
sees the connection."""

from __future__ import annotations

import re
from pathlib import Path
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from flows.metrics import CycleMetrics, RLResult


def artifact_key(*parts: str) -> str:
    """A valid Prefect artifact key (lowercase letters, digits, dashes) from `parts`."""
    text = "-".join(parts).lower()
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", text)).strip("-")


def metrics_row(metrics: CycleMetrics) -> dict[str, float | int | None]:
    """The cycle's metrics as one flat table row (seconds per operation kind as columns)."""
    row = metrics.model_dump(mode="json", exclude={"op_seconds"})
    for kind, seconds in sorted(metrics.op_seconds.items()):
        row[f"seconds_{kind}"] = round(seconds, 4)
    return {
        name: round(value, 6) if isinstance(value, float) else value for name, value in row.items()
    }


def record_cycle_table(metrics: CycleMetrics) -> UUID:
    """A one-row table artifact on the cycle's subflow run."""
    return create_table_artifact(
        table=[metrics_row(metrics)], description=f"Metrics of cycle {metrics.cycle}"
    )


class RunRecords:
    """A flow run's progress artifact, metrics file and summary (keys start with `key_prefix`)."""

    def __init__(self, key_prefix: str, total_cycles: int, metrics_path: str | None) -> None:
        self.key_prefix = artifact_key(key_prefix)
        self.total_cycles = total_cycles
        self.metrics_path = Path(metrics_path) if metrics_path else None
        self.cycles: list[CycleMetrics] = []
        self._progress_id = create_progress_artifact(
            progress=0.0,
            key=artifact_key(self.key_prefix, "progress"),
            description=f"Cycles done, of {total_cycles}",
        )

    def add_cycle(self, metrics: CycleMetrics) -> None:
        """Append the metrics JSON line and move the progress artifact."""
        self.cycles.append(metrics)
        if self.metrics_path is not None:
            with self.metrics_path.open("a", encoding="utf-8") as stream:
                stream.write(metrics.model_dump_json() + "\n")
        update_progress_artifact(
            self._progress_id, progress=100.0 * len(self.cycles) / self.total_cycles
        )

    def add_summary(self, result: RLResult) -> UUID:
        """The final markdown summary: the checkpoint, the exported adapter, the reward."""
        first = result.cycles[: min(5, len(result.cycles))]
        last = result.cycles[-len(first) :]
        markdown = "\n".join(
            [
                "# RL flow summary",
                "",
                "| | |",
                "| --- | --- |",
                f"| cycles | {len(result.cycles)} |",
                f"| reward, first {len(first)} cycles | {_mean_reward(first):.3f} |",
                f"| reward, last {len(last)} cycles | {_mean_reward(last):.3f} |",
                f"| Whitney session | `{result.session_id}` |",
                f"| Whitney run | `{result.run_id}` |",
                f"| checkpoint (resume point) | `{result.checkpoint}` |",
                f"| exported adapter | artifact `{result.adapter.artifact_id}` "
                f"({result.adapter.format}, {result.adapter.bytes} bytes) |",
                f"| adapter sha256 | `{result.adapter.sha256}` |",
            ]
        )
        return create_markdown_artifact(
            markdown=markdown,
            key=artifact_key(self.key_prefix, "summary"),
            description="Checkpoint and exported adapter of the RL flow run",
        )


def _mean_reward(cycles: list[CycleMetrics]) -> float:
    return sum(metrics.reward_mean for metrics in cycles) / max(1, len(cycles))
