"""What happened in cycle N, on the terminal: the rendering of the `whitney-flows inspect` and
`runs` reports (`flows.cli.inspection_journal` builds them from the journal that
`flows.cli.inspection_sources` reads).

    whitney-flows inspect RUN_ID [--cycle N] [--json]
    whitney-flows runs [--json]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flows.core.cost import format_usage
from flows.core.operation_rows import metrics_text, parse_time, seconds_text


def created_text(value: str) -> str:
    """An API timestamp in local time, to the minute."""
    moment = parse_time(value)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M") if moment else value


def render_run_report(report: Mapping[str, Any], console: Any) -> None:
    """Print a run report with rich: the run, then one table per group."""
    from rich.table import Table

    run = report["run"]
    console.print(
        f"[bold]run {run['run_id']}[/bold]  session {run['session_id']}  {run['role']}"
        f"{'' if run['trainable'] else ' (frozen)'}  "
        f"{model_text(run['provider'], run['base_model'])}  "
        f"status {run['status']}  step {run['step']}  {report['operations']} operations  "
        f"{report['tokens']:,} tokens ({format_usage(report['usage'])})",
        soft_wrap=True,
    )
    for group in report["groups"]:
        seq = group["seq_ids"]
        table = Table(
            title=f"{group['label']}: seq {seq[0]}–{seq[1]}, {group['tokens']:,} tokens",
            title_justify="left",
        )
        for column in ("seq", "kind", "status", "duration", "queued", "tokens", "metrics"):
            table.add_column(column, overflow="fold", no_wrap=column != "metrics")
        for row in group["operations"]:
            table.add_row(
                str(row["seq_id"]),
                row["kind"] + (f" (turn {row['turn']})" if "turn" in row else ""),
                row["status"],
                seconds_text(row["duration_s"]),
                seconds_text(row["queued_s"]),
                f"{row['usage'].get('tokens', 0):,}",
                metrics_text(row["metrics"]),
            )
        console.print(table)
        if group["turns"]:
            console.print(turns_text(group["turns"]), soft_wrap=True)


def turns_text(blocks: Sequence[Mapping[str, Any]]) -> str:
    """A cycle's turns on one line each: seq ids, samples, sequences (episodes), tokens."""
    return "\n".join(
        f"  turn {block['turn']}: seq {block['seq_ids'][0]}–{block['seq_ids'][1]}, "
        f"{block['samples']} samples, {block['sequences']} episodes, "
        f"{block['sampled_tokens']:,} tokens sampled"
        for block in blocks
    )


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
