"""What the final summaries of every flow share, in the terminal and in the Prefect summary
artifact: a metric over the first and last cycles of a run, and the command that exports its
adapter (a flow run's: with the URL of its Whitney, `blocks.endpoint.flow_run_api_url`). No
Prefect import."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from typing import TypeVar

from blocks.endpoint import EMBEDDED_DATA_DIR_ENV, flow_run_api_url

CycleT = TypeVar("CycleT")


def cycles_text(count: int) -> str:
    return "cycle" if count == 1 else f"{count} cycles"


def first_and_last(
    name: str, cycles: Sequence[CycleT], value: Callable[[CycleT], float], most: int
) -> list[tuple[str, float]]:
    """(label, mean of `value`) over the first and over the last `most` cycles, each at most
    half the run, so they never overlap; a single cycle's value alone; none without cycles."""
    if len(cycles) <= 1:
        return [(f"{name}, {cycles_text(1)}", value(cycles[0]))] if cycles else []
    window = min(most, len(cycles) // 2)
    first, last = cycles[:window], cycles[-window:]
    return [
        (f"{name}, first {cycles_text(window)}", sum(map(value, first)) / window),
        (f"{name}, last {cycles_text(window)}", sum(map(value, last)) / window),
    ]


def export_command(run_id: str, api_url: str | None, data_dir: str | None = None) -> str:
    """The shell command that exports the run's adapter; `api_url` None for a run on the
    embedded server of `whitney-flows run`, `data_dir` its data directory when not the
    default one. The key stays in WHITNEY_API_KEY."""
    command = ["whitney-flows", "export", run_id, "--out", f"exports/{run_id}"]
    if api_url:
        command += ["--api-url", api_url]
    elif data_dir:
        command += ["--data-dir", data_dir]
    return shlex.join(command)


def flow_run_export_command(run_id: str) -> str:
    """The command that exports the current flow run's adapter of `run_id`: with the URL of
    its Whitney, or the data directory of `whitney-flows run`'s embedded server if not the
    default one."""
    api_url = flow_run_api_url()
    return export_command(run_id, api_url, os.environ.get(EMBEDDED_DATA_DIR_ENV))
