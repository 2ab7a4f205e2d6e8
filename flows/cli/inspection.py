"""What happened in cycle N, on the terminal: the rendering of the `whitney-flows inspect` and
`runs` reports (`flows.core.records.inspection_journal` builds them from the journal that
`flows.core.records.inspection_sources` reads).

    whitney-flows inspect RUN_ID [--cycle N] [--json]
    whitney-flows runs [--json]
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from flows.core.loop.cost import format_usage
from flows.core.records.inspection_journal import metrics_text, parse_time, seconds_text


def created_text(value: str) -> str:
    """An API timestamp in local time, to the minute."""
    moment = parse_time(value)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M") if moment else value


OPERATION_COLUMNS = ("seq", "kind", "status", "duration", "queued", "tokens", "metrics")
METRICS_MIN_WIDTH = 40
"""A table whose metrics column would be narrower than this (a pipe or a terminal of 80
columns) prints each operation's metrics on lines of their own under it instead."""
METRICS_INDENT = "      "


def operation_cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    """An operation's row of a run report as the text of each of `OPERATION_COLUMNS`."""
    return (
        str(row["seq_id"]),
        row["kind"] + (f" (turn {row['turn']})" if "turn" in row else ""),
        row["status"],
        seconds_text(row["duration_s"]),
        seconds_text(row["queued_s"]),
        f"{row['usage'].get('tokens', 0):,}",
        metrics_text(row["metrics"]),
    )


def column_widths(cells: Sequence[tuple[str, ...]]) -> list[int]:
    """The widest text of each of `OPERATION_COLUMNS`, its header included."""
    return [max(map(len, column)) for column in zip(OPERATION_COLUMNS, *cells, strict=True)]


def metrics_room(cells: Sequence[tuple[str, ...]], width: int) -> int:
    """The width a rich table of `width` columns (borders, one space of padding each side)
    leaves its metrics column once every other column has its widest cell."""
    return width - sum(column_widths(cells)[:-1]) - 3 * len(OPERATION_COLUMNS) - 1


def render_run_report(report: Mapping[str, Any], console: Any) -> None:
    """Print a run report with rich: the run, then one table per group (stacked: the metrics
    under each operation, when the table would squeeze them)."""
    run = report["run"]
    console.print(
        f"[bold]run {run['run_id']}[/bold]  session {run['session_id']}  {run['role']}"
        f"{'' if run['trainable'] else ' (frozen)'}  "
        f"{model_text(run['provider'], run['base_model'])}  "
        f"{trained_at_text(run)}"
        f"status {run['status']}  step {run['step']}  {report['operations']} operations  "
        f"{report['tokens']:,} tokens ({format_usage(report['usage'])})",
        soft_wrap=True,
    )
    for group in report["groups"]:
        seq = group["seq_ids"]
        title = f"{group['label']}: seq {seq[0]}–{seq[1]}, {group['tokens']:,} tokens"
        cells = [operation_cells(row) for row in group["operations"]]
        longest = max((len(row[-1]) for row in cells), default=0)
        if metrics_room(cells, console.width) >= min(longest, METRICS_MIN_WIDTH):
            print_table(title, cells, console)
        else:
            print_stacked(title, cells, console)
        if group["turns"]:
            console.print(turns_text(group["turns"]), soft_wrap=True)


def print_table(title: str, cells: Sequence[tuple[str, ...]], console: Any) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in OPERATION_COLUMNS:
        table.add_column(column, overflow="fold", no_wrap=column != "metrics")
    for row in cells:
        table.add_row(*row)
    console.print(table)


def print_stacked(title: str, cells: Sequence[tuple[str, ...]], console: Any) -> None:
    """One line per operation with its columns aligned, then its metrics, word-wrapped to the
    console's width under it."""
    widths = column_widths(cells)
    right = {0, 3, 4, 5}  # seq, duration, queued, tokens

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row[:-1], widths[:-1], strict=True))
        ).rstrip()

    lines = [title, line(OPERATION_COLUMNS)]
    for row in cells:
        lines.append(line(row))
        lines += textwrap.wrap(
            row[-1],
            width=max(console.width, len(METRICS_INDENT) + 20),
            initial_indent=METRICS_INDENT,
            subsequent_indent=METRICS_INDENT,
            break_long_words=False,
            break_on_hyphens=False,
        )
    console.print("\n".join(lines), soft_wrap=True, markup=False, highlight=False)


def turns_text(blocks: Sequence[Mapping[str, Any]]) -> str:
    """A cycle's turns on one line each: seq ids, samples, sequences (episodes), tokens."""
    return "\n".join(
        f"  turn {block['turn']}: seq {block['seq_ids'][0]}–{block['seq_ids'][1]}, "
        f"{block['samples']} samples, {block['sequences']} episodes, "
        f"{block['sampled_tokens']:,} tokens sampled"
        for block in blocks
    )


def trained_at_text(run: Mapping[str, Any]) -> str:
    """Where a forwarded run trains (`trained at <endpoint>  `), else nothing."""
    return f"trained at {run['trained_at']}  " if run.get("trained_at") else ""


def model_text(provider: str, base_model: str) -> str:
    """The base model, with its provider unless the name starts with it (local/tiny)."""
    return base_model if base_model.startswith(f"{provider}/") else f"{base_model} ({provider})"


def render_runs_report(report: Mapping[str, Any], console: Any) -> None:
    from rich.box import SIMPLE_HEAD
    from rich.table import Table

    table = Table(
        title="Whitney sessions and runs, newest first",
        title_justify="left",
        box=SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 2, 0, 0),
    )
    for column in ("session", "created", "status", "run", "role", "model", "run status", "step"):
        whole = column in ("session", "created", "run")  # ids stay whole, to copy
        table.add_column(column, overflow="fold", no_wrap=whole, min_width=len(column))
    table.add_column("ops")
    for session in report["sessions"]:
        runs = session["runs"] or [None]
        for index, run in enumerate(runs):
            first = index == 0
            table.add_row(
                session["session_id"] if first else "",
                created_text((run or session)["created_at"]),
                session["status"] if first else "",
                run["run_id"] if run else "-",
                (run["role"] + ("" if run["trainable"] else " (frozen)")) if run else "",
                model_text(run["provider"], run["base_model"]) if run else "",
                run["status"] if run else "",
                str(run["step"]) if run else "",
                str(run["operations"]) if run else "",
            )
    console.print(table)
