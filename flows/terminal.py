"""What `whitney-flows run` shows: a progress bar per cycle with the latest reward and loss
(fed by the flow's metrics JSON lines, tailed from the file), and a summary table."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from flows.metrics import CycleMetrics, RLResult

POLL_INTERVAL_S = 0.2


def describe_rl_cycle(line: dict[str, Any]) -> str:
    """The progress bar's text after an RL cycle's metrics line."""
    metrics = CycleMetrics.model_validate(line)
    return f"reward {metrics.reward_mean:.3f}  loss {metrics.loss:+.3f}"


class CycleProgress:
    """A rich progress bar advanced by each metrics line the flow appends to `metrics_path`,
    its text from `describe(line)` (an RL cycle's reward and loss by default)."""

    def __init__(
        self,
        metrics_path: Path,
        total_cycles: int,
        console: Console,
        label: str = "RL cycles",
        describe: Callable[[dict[str, Any]], str] = describe_rl_cycle,
    ) -> None:
        self.metrics_path = metrics_path
        self._describe = describe
        self._offset = metrics_path.stat().st_size if metrics_path.exists() else 0
        self._progress = Progress(
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[latest]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._task = self._progress.add_task(
            "cycles", total=total_cycles, latest="starting Prefect and the first cycle"
        )
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="cycle-progress", daemon=True)

    def __enter__(self) -> CycleProgress:
        self._progress.start()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stopped.set()
        self._thread.join()
        self._read_new_lines()
        self._progress.stop()

    def _follow(self) -> None:
        while not self._stopped.wait(POLL_INTERVAL_S):
            self._read_new_lines()

    def _read_new_lines(self) -> None:
        if not self.metrics_path.exists():
            return
        with self.metrics_path.open("rb") as stream:
            stream.seek(self._offset)
            chunk = stream.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            self._progress.update(self._task, advance=1, latest=self._describe(json.loads(line)))


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
