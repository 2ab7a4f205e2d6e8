"""What a flow run leaves behind for people: per cycle a table artifact row and a metrics
JSON line, a progress artifact, and a final markdown summary, which names the command that
exports the adapter. Never the API key: only the Whitney URL goes into a summary."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from flows.core.connection import flow_run_api_url
from flows.core.summary import export_command


def artifact_key(*parts: str) -> str:
    """A valid Prefect artifact key (lowercase letters, digits, dashes) from `parts`."""
    text = "-".join(parts).lower()
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", text)).strip("-")


class CycleRecord(Protocol):
    """What the records need of a flow's cycle metrics (a pydantic model: CycleMetrics for
    RL, SFTCycleMetrics for SFT)."""

    cycle: int
    op_seconds: dict[str, float]

    def model_dump(self, **options: Any) -> dict[str, Any]: ...

    def model_dump_json(self, **options: Any) -> str: ...


def metrics_row(metrics: CycleRecord) -> dict[str, float | int | None]:
    """The cycle's metrics as one flat table row: seconds per operation kind as columns;
    nested values (an SFT cycle's evals) stay in the metrics JSON line."""
    row = metrics.model_dump(mode="json", exclude={"op_seconds"})
    row = {name: value for name, value in row.items() if not isinstance(value, list | dict)}
    row.update(sorted(getattr(metrics, "recipe_metrics", {}).items()))  # e.g. value_loss
    for kind, counters in sorted((getattr(metrics, "usage", None) or {}).items()):
        row[f"tokens_{kind}"] = int(counters.get("tokens", 0))  # billed usage (flows.core.cost)
    for kind, seconds in sorted(metrics.op_seconds.items()):
        row[f"seconds_{kind}"] = round(seconds, 4)
    return {
        name: round(value, 6) if isinstance(value, float) else value for name, value in row.items()
    }


def record_cycle_table(metrics: CycleRecord) -> UUID:
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
        self.cycles: list[Any] = []  # the flow's cycle metrics, in order
        self._progress_id = create_progress_artifact(
            progress=0.0,
            key=artifact_key(self.key_prefix, "progress"),
            description=f"Cycles done, of {total_cycles}",
        )

    def add_cycle(self, metrics: CycleRecord) -> None:
        """Append the metrics JSON line and move the progress artifact."""
        self.cycles.append(metrics)
        if self.metrics_path is not None:
            with self.metrics_path.open("a", encoding="utf-8") as stream:
                stream.write(metrics.model_dump_json() + "\n")
        update_progress_artifact(
            self._progress_id, progress=100.0 * len(self.cycles) / self.total_cycles
        )

    def add_markdown_summary(
        self, title: str, rows: list[tuple[str, str]], description: str
    ) -> UUID:
        """The final summary of any flow: a markdown table of (name, value) rows."""
        lines = [f"# {title}", "", "| | |", "| --- | --- |"]
        lines += [f"| {name} | {value} |" for name, value in rows]
        return create_markdown_artifact(
            markdown="\n".join(lines),
            key=artifact_key(self.key_prefix, "summary"),
            description=description,
        )


def run_rows(result: Any) -> list[tuple[str, str]]:
    """Summary rows every training flow shows: its Whitney session and run, the checkpoint,
    the exported adapter and the command that exports it (`result` has session_id, run_id,
    checkpoint and adapter)."""
    adapter = result.adapter
    return [
        ("Whitney session", f"`{result.session_id}`"),
        ("Whitney run", f"`{result.run_id}`"),
        ("checkpoint (resume point)", f"`{result.checkpoint}`"),
        (
            "exported adapter",
            f"artifact `{adapter.artifact_id}` ({adapter.format}, {adapter.bytes} bytes)",
        ),
        ("adapter sha256", f"`{adapter.sha256}`"),
        ("export", f"`{export_command(result.run_id, flow_run_api_url())}`"),
    ]
