"""What `whitney-flows run` shows: progress over the cycles with the latest metrics (fed by
the flows' metrics JSON lines, tailed from their files), and a summary table.

On a terminal, rich progress bars with the elapsed time and an ETA. Anywhere else (a pipe, a
log file, CI), one plain line per cycle as it happens, with the same metrics and times."""

from __future__ import annotations

import contextvars
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from flows.core.loop.training import TrainingResult

POLL_INTERVAL_S = 0.2
SPEED_WINDOW_S = 3600.0
"""The ETA comes from the pace of the cycles that ended in the last hour."""
STARTING = "starting Prefect and the first cycle"
WAITING = "waiting"


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


def clock(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds)))


def plain_line(task: Task) -> str:
    """A bar as one line of text: label, cycles done, latest metrics, elapsed time, ETA."""
    line = f"{task.description} {task.completed:.0f}/{task.total:.0f}  {task.fields['latest']}"
    if task.completed:
        line += f"  {clock(task.elapsed or 0.0)} elapsed"
        remaining = task.time_remaining
        if remaining:
            line += f", ETA {clock(remaining)}"
    return line


class PollingThread:
    """While entered, runs `poll_until_stopped` in a daemon thread named `name`, in a copy of
    the entering context (the flow's Prefect settings); exiting stops it, then calls
    `stopped`."""

    def __init__(self, name: str, interval_s: float) -> None:
        self.interval_s = interval_s
        self._name = name
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self.poll_until_stopped,), name=self._name, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self.stopped()

    def ticks(self) -> Iterator[None]:
        """One tick every `interval_s` seconds until the block exits."""
        while not self._stopped.wait(self.interval_s):
            yield

    def join(self) -> None:
        """Wait for the thread to end (after the block exits)."""
        if self._thread is not None:
            self._thread.join()

    def poll_until_stopped(self) -> None:
        """The thread's body: typically a loop over `ticks()`."""
        raise NotImplementedError

    def stopped(self) -> None:
        """Called on exit, after the thread was told to stop (it may still be running)."""


class CycleProgress(PollingThread):
    """Progress of one or more flows, one bar per (label, metrics file, total cycles) in
    `bars`, each advanced by the metrics lines a flow appends to its file; its text from
    `describe(line)` (the catalogue's `progress` of the flow), until the first line: the first
    bar `STARTING`, any later bar `WAITING`. Rich bars on a terminal console, else one printed
    line per metrics line (and one per bar at start)."""

    def __init__(
        self,
        bars: Sequence[tuple[str, Path, int]],
        console: Console,
        describe: Callable[[dict[str, Any]], str],
    ) -> None:
        super().__init__("cycle-progress", POLL_INTERVAL_S)
        self._describe = describe
        self._console = console
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[latest]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            speed_estimate_period=SPEED_WINDOW_S,
        )
        self._files: list[FollowedFile] = []
        for index, (label, path, total) in enumerate(bars):
            offset = path.stat().st_size if path.exists() else 0
            latest = WAITING if index else STARTING
            task = self._progress.add_task(label, total=total, latest=latest)
            self._files.append(FollowedFile(path, task, offset))

    def __enter__(self) -> Self:
        if self._console.is_terminal:
            self._progress.start()
        else:
            for followed in self._files:
                self._print(followed.task)
        return super().__enter__()

    def poll_until_stopped(self) -> None:
        for _ in self.ticks():
            self._read_new_lines()

    def stopped(self) -> None:
        self.join()
        self._read_new_lines()
        if self._console.is_terminal:
            self._progress.stop()

    def _read_new_lines(self) -> None:
        for followed in self._files:
            for line in followed.new_lines():
                latest = self._describe(json.loads(line))
                self._progress.update(followed.task, advance=1, latest=latest)
                if not self._console.is_terminal:
                    self._print(followed.task)

    def _print(self, task_id: TaskID) -> None:
        """The bar's plain line; nothing once the reader has closed the pipe (the summary's
        print then ends the command)."""
        (task,) = (task for task in self._progress.tasks if task.id == task_id)
        with suppress(BrokenPipeError):
            self._console.print(plain_line(task), markup=False, highlight=False, soft_wrap=True)


def result_table(title: str, first: tuple[str, str], wall_seconds: float) -> Table:
    """A flow's end-of-run table, started: its first row, then the wall time."""
    table = Table(title=title, show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row(*first)
    table.add_row("wall time", f"{wall_seconds:.1f} s")
    return table


def add_weights_rows(
    table: Table, result: TrainingResult, adapter_path: Path, runs: list[tuple[str, str]]
) -> None:
    """The rows every end-of-run table ends with: the checkpoint it resumed from (if any),
    the runs, the checkpoint, the adapter."""
    if result.resumed_from:
        table.add_row("resumed from", result.resumed_from)
    for label, run_id in runs:
        table.add_row(label, run_id)
    table.add_row("checkpoint", result.checkpoint)
    table.add_row("adapter artifact", f"{result.adapter.artifact_id} ({result.adapter.format})")
    table.add_row("adapter sha256", result.adapter.sha256)
    table.add_row("adapter file", str(adapter_path))
