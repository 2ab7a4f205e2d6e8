"""The one outer loop of every training flow, its cycles as subflow runs in order, and the
records it leaves for people.

    last = run_cycles(rl_cycle, config, range(first, config.cycles), step,
                      records=records, guard=guard)

`step(cycle_flow, cycle, previous)` calls the cycle subflow (`cycle_flow`: the flow's cycle
with the config's retries and task runner), starting where the previous cycle's metrics say it
ended (their seq ids; None before the first cycle), and returns the cycle's metrics. Around it
the loop does what every flow needs: between cycles it stops if the flow run was asked to
cancel or the budget says the next cycle would go over; after each, it adds the cycle's cost
and writes its records (the metrics line, the progress artifact).

Prefect 3.9 leaves a local (not deployed) flow run asked to cancel in Cancelling and lets its
body run to the end; only then does `on_cancellation` fire. So the loop reads its flow run's
state at each cycle boundary and raises `CancellationRequested`; the hook then cancels the
Whitney run at once. (A deployed run is killed by its runner, whose `on_cancellation` does the
same.)

The records: per cycle one markdown artifact on its subflow run (its metrics and its
operations per run, as `whitney-flows inspect RUN --cycle N` shows them) and a metrics JSON
line; a progress artifact; and a final markdown summary, which names the command that exports
the adapter. Never the API key: only the Whitney URL goes into a summary.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from prefect import Flow, get_client, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.client.orchestration import SyncPrefectClient
from prefect.context import FlowRunContext
from pydantic import BaseModel, Field

from flows.core.budget import BudgetGuard
from flows.core.config import FlowConfig
from flows.core.connection import flow_run_api_url, resolve_connection
from flows.core.cost import Usage
from flows.core.events import CycleEvents, checkpoint_saved
from flows.core.heartbeat import subflows_without_heartbeat
from flows.core.operation_rows import metrics_text, operation_row, seconds_text
from flows.core.plots import Panel, picture_beside, render_png
from flows.core.sequenced_client import SequencedClient
from flows.core.summary import export_command
from flows.core.task_runner_settings import TaskRunnerSettings
from flows.core.task_runners import cycle_task_runners
from whitney import wire


class CycleResult(BaseModel):
    """What every cycle subflow returns (its flow's metrics extend it): where the cycle
    started and where the next one starts, and its timings. The records are written from it."""

    cycle: int
    started_at: datetime = Field(description="When the cycle's work began (UTC)")
    seq_start: int = Field(description="First seq id of the cycle")
    seq_end: int = Field(description="Seq id the next cycle starts at")
    op_seconds: dict[str, float] = Field(description="Wall seconds per operation kind")
    wall_seconds: float


M = TypeVar("M", bound=CycleResult)
CycleStep = Callable[[Flow[..., M], int, M | None], M]
"""(cycle subflow, cycle, the previous cycle's metrics or None) -> the cycle's metrics."""
THREADS = TaskRunnerSettings()
"""The task runner of a flow whose config does not choose one: Prefect's thread pool."""


class CancellationRequested(RuntimeError):
    """The flow run was asked to cancel; raised at a cycle boundary."""


def raise_if_cancelling(prefect: SyncPrefectClient, flow_run_id: UUID) -> None:
    """CancellationRequested if the flow run is Cancelling or Cancelled."""
    state = prefect.read_flow_run(flow_run_id).state
    if state is not None and (state.is_cancelling() or state.is_cancelled()):
        raise CancellationRequested(f"flow run {flow_run_id} was asked to cancel")


def run_cycles(
    cycle: Flow[..., M],
    config: FlowConfig,
    cycles: range,
    step: CycleStep[M],
    *,
    records: RunRecords,
    guard: BudgetGuard | None = None,
    estimate: Callable[[int], Usage | None] | None = None,
) -> M | None:
    """Run `cycles` through `step`, within the budget (`estimate`: an upper bound of a
    cycle's usage before the first has run), stopping on cancellation; the metrics of the
    last cycle it ran (None: none ran)."""
    flow_run_id = FlowRunContext.get().flow_run.id
    runner_settings = config if isinstance(config, TaskRunnerSettings) else THREADS
    events = CycleEvents(config.stall)
    last: M | None = None
    with (
        cycle_task_runners(runner_settings) as runner_for_cycle,
        subflows_without_heartbeat(),
        get_client(sync_client=True) as prefect,
    ):
        cycle_flow = cycle.with_options(
            retries=config.cycle_retries,
            retry_delay_seconds=config.cycle_retry_delay_s,
            task_runner=runner_for_cycle(),
        )
        for number in cycles:
            raise_if_cancelling(prefect, flow_run_id)
            if guard is not None:
                bound = estimate(number) if estimate is not None else None
                if (reason := guard.stop_reason(number, estimate=bound)) is not None:
                    get_run_logger().warning("%s: saving, exporting and closing now", reason)
                    break
            events.started(number)
            metrics = step(cycle_flow, number, last)
            if guard is not None:  # the flows with a budget record the cycle's `usage`
                cost = guard.add_cycle(metrics.usage)  # type: ignore[attr-defined]
                metrics = metrics.model_copy(update={"cost": cost})
            records.add_cycle(metrics)
            events.completed(number, metrics_row(metrics, rounded=False))
            if (checkpoint := getattr(metrics, "checkpoint", None)) is not None:
                checkpoint_saved(checkpoint, config.eval_settings())
            last = metrics
    return last


def cycle_client(
    config: FlowConfig, whitney_block: str | None, starts: Mapping[str, int]
) -> SequencedClient:
    """A cycle subflow's ordered calls, from the seq ids `starts` of its runs."""
    connection = resolve_connection(config.api_url, whitney_block)
    return SequencedClient(connection, starts, config.task_retry)


def artifact_key(*parts: str) -> str:
    """A valid Prefect artifact key (lowercase letters, digits, dashes) from `parts`."""
    text = "-".join(parts).lower()
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", text)).strip("-")


def metrics_row(metrics: CycleResult, rounded: bool = True) -> dict[str, float | int | str | None]:
    """The cycle's metrics as one flat table row: an inline evaluation's as `eval.<name>`,
    seconds per operation kind as columns; other nested values (an SFT cycle's evals) stay in
    the metrics JSON line. Floats to 6 decimals (`rounded`), as the table shows them."""
    row = metrics.model_dump(mode="json", exclude={"op_seconds"})
    evaluation = row.pop("eval", None) or {}
    row = {name: value for name, value in row.items() if not isinstance(value, list | dict)}
    row.update((f"eval.{name}", value) for name, value in evaluation.items() if value is not None)
    row.update(sorted(getattr(metrics, "recipe_metrics", {}).items()))  # e.g. value_loss
    for kind, counters in sorted((getattr(metrics, "usage", None) or {}).items()):
        row[f"tokens_{kind}"] = int(counters.get("tokens", 0))  # billed usage (flows.core.cost)
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
    with its learning curves (a PNG in the summary, and beside the metrics file)."""

    def __init__(self, key_prefix: str, total_cycles: int, metrics_path: str | None) -> None:
        self.key_prefix = artifact_key(key_prefix)
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
        """Append the metrics JSON line and move the progress artifact."""
        self.cycles.append(metrics)
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
        if curves:
            png = render_png(curves)
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
        ("export", f"`{export_command(result.run_id, flow_run_api_url())}`"),
    ]


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
