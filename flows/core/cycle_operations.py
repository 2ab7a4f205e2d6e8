"""A cycle's operations: kept by a `RecordingLog`, grouped per run, and written as the cycle
subflow's markdown artifact (what `whitney-flows inspect RUN --cycle N` shows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flows.core.operation_log import OperationLog
from flows.core.operation_rows import metrics_text, operation_row, seconds_text
from whitney import wire


def operations_markdown(title: str, runs: Mapping[str, Sequence[wire.Operation]]) -> str:
    """A cycle's operations per run as markdown: what `inspect --cycle N` shows, for the
    cycle subflow's artifact."""
    lines = [f"# {title}", ""]
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


class RecordingLog(OperationLog):
    """An OperationLog that also keeps the operations, for the cycle's operations artifact."""

    def __init__(self) -> None:
        super().__init__()
        self.operations: list[wire.Operation] = []

    def record(self, operation: wire.Operation) -> None:
        super().record(operation)
        self.operations.append(operation)


def record_cycle_operations(cycle: int, runs: Mapping[str, Sequence[wire.Operation]]) -> Any:
    """A markdown artifact on the cycle's subflow run: its operations per run, as
    `whitney-flows inspect RUN_ID --cycle N` shows them."""
    from prefect.artifacts import create_markdown_artifact

    return create_markdown_artifact(
        markdown=operations_markdown(f"Cycle {cycle}: operations", runs),
        description=f"Every Whitney operation of cycle {cycle}, as `whitney-flows inspect "
        f"RUN_ID --cycle {cycle}` shows it",
    )


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
