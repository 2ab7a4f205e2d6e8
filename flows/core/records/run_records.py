"""The records a training flow run leaves for people: per cycle one markdown artifact on its
subflow run (its metrics and its operations per run, as `whitney-flows inspect RUN --cycle N`
shows them) and a metrics JSON line; a progress artifact; and a final markdown summary, which
names the command that exports the adapter. The metrics, the summary and its learning curves
also go to the experiment trackers the config names (flows.core.records.tracking). Never the API
key:
only the Whitney URL goes into a summary.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)

from flows.core.loop.cost import format_cost
from flows.core.records.inspection_journal import metrics_text, operation_row, seconds_text
from flows.core.records.plots import Panel, picture_beside, render_png
from flows.core.records.summary_parts import flow_run_export_command
from whitney import wire

if TYPE_CHECKING:
    from flows.core.loop.cycles import CycleResult
    from flows.core.records.tracking.session import Tracking


def artifact_key(*parts: str) -> str:
    """A valid Prefect artifact key (lowercase letters, digits, dashes) from `parts`."""
    text = "-".join(parts).lower()
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", text)).strip("-")


def metrics_row(metrics: CycleResult, rounded: bool = True) -> dict[str, float | int | str | None]:
    """The cycle's metrics as one flat table row: an inline evaluation's as `eval.<name>`
    (the one before the cycle trained as `eval_before.<name>`), seconds per operation kind as
    columns; other nested values (an SFT cycle's evals) stay in the metrics JSON line. Floats
    to 6 decimals (`rounded`), as the table shows them."""
    row = metrics.model_dump(mode="json", exclude={"op_seconds"})
    evaluations = {key: row.pop(key, None) or {} for key in ("eval_before", "eval")}
    row = {name: value for name, value in row.items() if not isinstance(value, list | dict)}
    for key, evaluation in evaluations.items():
        row.update((f"{key}.{name}", v) for name, v in evaluation.items() if v is not None)
    row.update(sorted(getattr(metrics, "recipe_metrics", {}).items()))  # e.g. value_loss
    for kind, counters in sorted((getattr(metrics, "usage", None) or {}).items()):
        row[f"tokens_{kind}"] = int(
            counters.get("tokens", 0)
        )  # billed usage (flows.core.loop.cost)
    for kind, seconds in sorted(metrics.op_seconds.items()):
        row[f"seconds_{kind}"] = round(seconds, 4)
    if not rounded:
        return row
    return {
        name: round(value, 6) if isinstance(value, float) else value for name, value in row.items()
    }


def record_cycle(
    metrics: CycleResult,
    runs: Mapping[str, Sequence[wire.Operation]],
    sections: Sequence[str] = (),
) -> UUID:
    """The cycle subflow run's one artifact: its metrics row, the flow's own markdown
    `sections` (an RL cycle's turns), and its operations per run (as `whitney-flows inspect
    RUN_ID --cycle N` shows them), written once, at its end."""
    row = metrics_row(metrics)
    lines = [
        f"# Cycle {metrics.cycle}",
        "",
        "## Metrics",
        "",
        "| metric | value |",
        "| --- | --- |",
    ]
    lines += [f"| {name} | {value} |" for name, value in row.items()]
    lines += [line for section in sections for line in ("", section)]
    lines += ["", operations_markdown("Operations", runs)]
    return create_markdown_artifact(
        markdown="\n".join(lines),
        description=f"Metrics and Whitney operations of cycle {metrics.cycle}",
    )


class RunRecords:
    """A flow run's progress artifact, metrics file and summary (keys start with `key_prefix`),
    with its learning curves (a PNG in the summary, and beside the metrics file), each also
    sent to `tracking`."""

    def __init__(
        self,
        key_prefix: str,
        total_cycles: int,
        metrics_path: str | None,
        tracking: Tracking | None = None,
    ) -> None:
        self.key_prefix = artifact_key(key_prefix)
        self.tracking = tracking
        self.total_cycles = total_cycles
        self.metrics_path = Path(metrics_path) if metrics_path else None
        self.cycles: list[Any] = []  # the flow's cycle metrics, in order
        self.picture_path: Path | None = None
        """Where the learning curves were written: beside the metrics file, if there is one."""
        self._progress_id = create_progress_artifact(
            progress=0.0,
            key=artifact_key(self.key_prefix, "progress"),
            description=f"Cycles done, of {total_cycles}",
        )

    def add_cycle(self, metrics: CycleResult) -> None:
        """Append the metrics JSON line, move the progress artifact, send the metrics row."""
        self.cycles.append(metrics)
        if self.tracking is not None:
            self.tracking.log_cycle(metrics.cycle, metrics_row(metrics, rounded=False))
        if self.metrics_path is not None:
            with self.metrics_path.open("a", encoding="utf-8") as stream:
                stream.write(metrics.model_dump_json() + "\n")
        update_progress_artifact(
            self._progress_id, progress=100.0 * len(self.cycles) / self.total_cycles
        )

    def add_markdown_summary(
        self,
        title: str,
        rows: list[tuple[str, str]],
        description: str,
        curves: Sequence[Panel] = (),
    ) -> UUID:
        """The final summary of any flow: a markdown table of (name, value) rows, then the
        learning curves as an inline PNG (a data URI, which the Prefect UI shows), the same
        bytes as the picture written beside the metrics file (`picture_path`)."""
        lines = [f"# {title}", "", "| | |", "| --- | --- |"]
        lines += [f"| {name} | {value} |" for name, value in rows]
        png = render_png(curves) if curves else None
        if self.tracking is not None:
            self.tracking.log_summary("\n".join(lines), png)
        if png is not None:
            if self.metrics_path is not None:
                self.picture_path = picture_beside(self.metrics_path)
                self.picture_path.write_bytes(png)
            data = base64.b64encode(png).decode("ascii")
            lines += [
                "",
                "## Learning curves",
                "",
                f"![learning curves](data:image/png;base64,{data})",
            ]
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
        ("export", f"`{flow_run_export_command(result.run_id)}`"),
        *lineage_rows(getattr(result, "lineage", None)),
    ]


def spend_rows(result: Any) -> list[tuple[str, str]]:
    """Summary rows of a flow with a total and a budget (`result` has total_tokens, cost,
    budget_stop and resumed_from): the tokens, the estimated cost, an early stop, the resume."""
    rows = [
        ("tokens, total", f"{result.total_tokens:,}"),
        ("estimated cost", format_cost(result.cost)),
    ]
    if result.budget_stop:
        rows.append(("stopped early", result.budget_stop))
    if result.resumed_from:
        rows.append(("resumed from", f"`{result.resumed_from}`"))
    return rows


def lineage_rows(lineage: Any) -> list[tuple[str, str]]:
    """A forked run's summary row (`lineage`: flows.core.records.lineage.Lineage, or None)."""
    if lineage is None:
        return []
    changes = lineage.changes
    changed = "changes unknown" if changes is None else ", ".join(changes) or "nothing changed"
    return [(lineage.kind, f"`{lineage.parent_checkpoint}` ({changed})")]


def operations_markdown(title: str, runs: Mapping[str, Sequence[wire.Operation]]) -> str:
    """A cycle's operations per run as a markdown section titled `title`."""
    lines = [f"## {title}", ""]
    for name, operations in runs.items():
        if not operations:
            continue
        lines += [
            f"**{name}** run `{operations[0].run_id}`",
            "",
            "| seq | kind | status | duration | queued | tokens | metrics |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for operation in sorted(operations, key=lambda op: op.seq_id):
            row = operation_row(operation)
            lines.append(
                f"| {row['seq_id']} | {row['kind']} | {row['status']} | "
                f"{seconds_text(row['duration_s'])} | {seconds_text(row['queued_s'])} | "
                f"{row['usage'].get('tokens', 0):,} | {metrics_text(row['metrics'])} |"
            )
        lines.append("")
    return "\n".join(lines)


def by_run(
    operations: Sequence[wire.Operation], names: Mapping[str, str]
) -> dict[str, list[wire.Operation]]:
    """Operations grouped per run, in order of first appearance, each under its name in
    `names` (run id -> name), else "run <run id>"."""
    grouped: dict[str, list[wire.Operation]] = {}
    for operation in operations:
        name = names.get(operation.run_id, f"run {operation.run_id}")
        grouped.setdefault(name, []).append(operation)
    return grouped
