"""What `whitney-flows run` shows: progress bars over the cycles with the latest reward and
loss (fed by the flows' metrics JSON lines, tailed from their files), and a summary table."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from flows.metrics import CycleMetrics, RLResult
from flows.polling import PollingThread

POLL_INTERVAL_S = 0.2


def describe_rl_cycle(line: dict[str, Any]) -> str:
    """The progress bar's text after an RL cycle's metrics line."""
    metrics = CycleMetrics.model_validate(line)
    return f"reward {metrics.reward_mean:.3f}  loss {metrics.loss:+.3f}"


@dataclass
class FollowedFile:
    """A metrics file a progress bar follows, from the size it had when the bar appeared."""

    path: Path
    task: TaskID
    offset: int

    def new_lines(self) -> list[bytes]:
        """The complete lines appended since the last call."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as stream:
            stream.seek(self.offset)
            chunk = stream.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        return complete.splitlines()


class CycleProgress(PollingThread):
    """Rich progress bars, one per (label, metrics file, total cycles) in `bars`, each advanced
    by the metrics lines a flow appends to its file; its text from `describe(line)` (an RL
    cycle's reward and loss by default), `waiting` until the first line."""

    def __init__(
        self,
        bars: Sequence[tuple[str, Path, int]],
        console: Console,
        describe: Callable[[dict[str, Any]], str] = describe_rl_cycle,
        waiting: str = "starting Prefect and the first cycle",
    ) -> None:
        super().__init__("cycle-progress", POLL_INTERVAL_S)
        self._describe = describe
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[latest]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._files: list[FollowedFile] = []
        for label, path, total in bars:
            offset = path.stat().st_size if path.exists() else 0
            task = self._progress.add_task(label, total=total, latest=waiting)
            self._files.append(FollowedFile(path, task, offset))

    def __enter__(self) -> Self:
        self._progress.start()
        return super().__enter__()

    def poll_until_stopped(self) -> None:
        for _ in self.ticks():
            self._read_new_lines()

    def stopped(self) -> None:
        self.join()
        self._read_new_lines()
        self._progress.stop()

    def _read_new_lines(self) -> None:
        for followed in self._files:
            for line in followed.new_lines():
                latest = self._describe(json.loads(line))
                self._progress.update(followed.task, advance=1, latest=latest)


def mean_reward(cycles: list[CycleMetrics]) -> float:
    return sum(metrics.reward_mean for metrics in cycles) / max(1, len(cycles))


def summary_table(result: RLResult, adapter_path: Path, wall_seconds: float) -> Table:
    """The end-of-run table: cycles, time, reward first and last, and where the weights are."""
    window = min(5, len(result.cycles))
    table = Table(title="RL flow finished", show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("cycles", str(len(result.cycles)))
    table.add_row("wall time", f"{wall_seconds:.1f} s")
    table.add_row(f"reward, first {window} cycles", f"{mean_reward(result.cycles[:window]):.3f}")
    table.add_row(f"reward, last {window} cycles", f"{mean_reward(result.cycles[-window:]):.3f}")
    table.add_row("final loss", f"{result.cycles[-1].loss:+.4f}")
    table.add_row("Whitney run", result.run_id)
    table.add_row("checkpoint", result.checkpoint)
    table.add_row("adapter artifact", f"{result.adapter.artifact_id} ({result.adapter.format})")
    table.add_row("adapter sha256", result.adapter.sha256)
    table.add_row("adapter file", str(adapter_path))
    return table
