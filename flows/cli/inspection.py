"""What happened in cycle N: a run's journal, read back from the server, grouped into cycles.

    whitney-flows inspect RUN_ID [--cycle N] [--json]
    whitney-flows runs [--json]

The server's journal is the record (DESIGN.md): every operation with its seq id, kind, status,
timestamps, billed usage and result. Nothing here needs the flow run that made them.

Cycle boundaries come from the journal alone: every cycle of every flow here begins by
publishing a sampler (`save_weights_for_sampler`), so a journal splits at those operations. A
sampler named `cycle-N` (pipelined RL, distillation, both of its runs) names its cycle; an
unnamed one (`sampler-<seq>`, the Loop building blocks' loop) counts cycles in order; another
name (an inline evaluation's `eval-N`, after cycle N; the distillation's `eval-start`,
`eval-end`) labels its group by that name. An inline evaluation sits between two cycles (a
pipelined cycle has published the next one's sampler before it): the next cycle's operations,
from its first sample on, go back to that cycle's group. Operations before the
first sampler are the `setup`; the trailing `save_state` / `export_lora` of the run's normal end
are the `final` group. A journal with no sampler at all (SFT) is listed by optimizer step.

Turns: a multi-turn cycle samples each turn of its episodes on a block of `sample`
operations, and each turn's prompt is the transcript so far: the prompt of the turn before, the
action sampled on it, then the environment's observation. So a `sample` whose prompt starts
with an earlier prompt and one of the actions sampled on it is that episode's next turn, and
one that continues nothing is a first turn (turn 0). The journal route answers no payloads, so
turns are found where the prompts can be read: in the data directory (the journal stores
every operation's payload).

Two sources: the Whitney API (`--api-url`, the key from WHITNEY_API_KEY), or the embedded
server's data directory (`--data-dir`, read-only: its SQLite journal, every tenant). No Prefect
import at module level: the commands start fast.
"""

from __future__ import annotations

import json
import re
import sqlite3
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from flows.core.cost import add_usage, format_usage, total_tokens
from flows.core.operation_rows import metrics_text, operation_row, parse_time, seconds_text
from tasks.names import CYCLE_SAMPLER, EVAL_SAMPLER
from whitney import wire

DEFAULT_SAMPLER = re.compile(r"^sampler-\d+$")
FINAL_KINDS = frozenset({"save_state", "export_lora"})


# --------------------------------------------------------------------------- sources


class JournalSource(Protocol):
    """Where sessions, runs and journals are read from."""

    def sessions(self) -> list[wire.Session]: ...

    def run(self, run_id: str) -> wire.Run: ...

    def operations(self, run_id: str) -> list[wire.Operation]: ...

    def sample_prompts(self, run_id: str) -> dict[int, list[int]] | None:
        """The prompt tokens of the run's `sample` operations by seq id; None if unknown."""
        ...


class ApiJournal:
    """A Whitney endpoint, through `WhitneyClient` (the caller's sessions only)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def sessions(self) -> list[wire.Session]:
        return [self.client.get_session(s.session_id) for s in self.client.list_sessions()]

    def run(self, run_id: str) -> wire.Run:
        return self.client.get_run(run_id)

    def operations(self, run_id: str) -> list[wire.Operation]:
        return list(self.client.iter_journal(run_id))

    def sample_prompts(self, run_id: str) -> dict[int, list[int]] | None:
        return None  # the journal route answers no payloads


class RunNotFound(LookupError):
    pass


class DataDirJournal:
    """An embedded server's data directory, read-only (SQLite; every tenant's sessions)."""

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir).expanduser() / "journal.sqlite3"
        if not self.path.is_file():
            raise FileNotFoundError(f"no Whitney journal at {self.path}")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10.0)
        connection.row_factory = sqlite3.Row
        try:
            return connection.execute(sql, tuple(params)).fetchall()
        finally:
            connection.close()

    def sessions(self) -> list[wire.Session]:
        sessions = []
        for row in self._query("SELECT * FROM sessions ORDER BY created_at, session_id"):
            runs = self._query(
                "SELECT run_id FROM runs WHERE session_id=? ORDER BY created_at, run_id",
                (row["session_id"],),
            )
            sessions.append(
                wire.Session(
                    session_id=row["session_id"],
                    status=row["status"],
                    labels=json.loads(row["labels"] or "{}"),
                    created_at=row["created_at"],
                    run_ids=[run["run_id"] for run in runs],
                )
            )
        return sessions

    def run(self, run_id: str) -> wire.Run:
        rows = self._query("SELECT * FROM runs WHERE run_id=?", (run_id,))
        if not rows:
            raise RunNotFound(f"no run {run_id} in {self.path}")
        row = rows[0]
        (top,) = self._query("SELECT MAX(seq_id) AS m FROM operations WHERE run_id=?", (run_id,))
        return wire.Run(
            run_id=row["run_id"],
            session_id=row["session_id"],
            provider=row["provider"],
            base_model=row["base_model"],
            lora_rank=row["lora_rank"],
            role=row["role"],
            trainable=bool(row["trainable"]),
            status=row["status"],
            next_seq_id=(top["m"] or 0) + 1,
            step=row["step"],
            error=json.loads(row["error"]) if row["error"] else None,
            created_at=row["created_at"],
            finished_at=row["finished_at"],  # the API's extra fields, as it answers them
            seed=row["seed"],
            from_checkpoint=row["from_checkpoint"],
            labels=json.loads(row["labels"] or "{}"),
        )

    def operations(self, run_id: str) -> list[wire.Operation]:
        from whitney.local.journal import operation_dict

        self.run(run_id)  # RunNotFound if it is not there
        rows = self._query(
            "SELECT run_id, seq_id, kind, sampler_id, status, result, error, usage,"
            " submitted_at, started_at, finished_at FROM operations WHERE run_id=?"
            " ORDER BY seq_id",
            (run_id,),
        )
        return [wire.Operation.model_validate(operation_dict(row)) for row in rows]

    def sample_prompts(self, run_id: str) -> dict[int, list[int]] | None:
        rows = self._query(
            "SELECT seq_id, payload FROM operations WHERE run_id=? AND kind='sample'", (run_id,)
        )
        return {row["seq_id"]: json.loads(row["payload"])["prompt"]["token_ids"] for row in rows}

    def artifact_file(self, artifact_id: str) -> Path | None:
        """The file an artifact (an export_lora archive) was written to; None if it is gone."""
        rows = self._query("SELECT path FROM artifacts WHERE artifact_id=?", (artifact_id,))
        path = Path(rows[0]["path"]) if rows else None
        return path if path is not None and path.is_file() else None


# --------------------------------------------------------------------------- operations


# --------------------------------------------------------------------------- cycles


@dataclass
class CycleGroup:
    """A stretch of a run's journal: a cycle (from its sampler to the next), the set-up, a
    named sampler's group (eval) or the final checkpoint and export."""

    label: str
    cycle: int | None = None
    operations: list[wire.Operation] = field(default_factory=list)
    turns: dict[int, int] = field(default_factory=dict)
    """The turn of each `sample` operation, by seq id (multi-turn cycles; see `sample_turns`)."""

    def as_dict(self) -> dict[str, Any]:
        usage: dict[str, dict[str, int]] = {}
        for operation in self.operations:
            add_usage(usage, {operation.kind: operation.usage})
        seq_ids = [operation.seq_id for operation in self.operations]
        rows = [operation_row(operation) for operation in self.operations]
        for row in rows:
            if row["seq_id"] in self.turns:
                row["turn"] = self.turns[row["seq_id"]]
        return {
            "label": self.label,
            "cycle": self.cycle,
            "seq_ids": [min(seq_ids), max(seq_ids)] if seq_ids else [],
            "usage": usage,
            "tokens": total_tokens(usage),
            "turns": turn_blocks(self.operations, self.turns),
            "operations": rows,
        }


def sample_turns(
    operations: Sequence[wire.Operation], prompts: Mapping[int, list[int]]
) -> dict[int, int]:
    """The turn of each `sample` of a cycle, by seq id (see the module docstring): one more
    than the turn whose prompt and action its prompt continues (the longest such), else 0.
    Empty unless some sample continues another (a single-turn cycle has no turns to show)."""
    turns: dict[int, int] = {}
    continuations: dict[int, dict[tuple[int, ...], int]] = {}  # length -> transcript -> turn
    for operation in sorted(operations, key=lambda op: op.seq_id):
        prompt = prompts.get(operation.seq_id)
        if operation.kind != "sample" or prompt is None:
            continue
        turn = 0
        for length in sorted(continuations, reverse=True):
            if length < len(prompt) and tuple(prompt[:length]) in continuations[length]:
                turn = continuations[length][tuple(prompt[:length])] + 1
                break
        turns[operation.seq_id] = turn
        for sequence in (operation.result or {}).get("sequences", []):
            transcript = (*prompt, *sequence.get("tokens", []))
            continuations.setdefault(len(transcript), {})[transcript] = turn
    return turns if any(turns.values()) else {}


def turn_blocks(
    operations: Sequence[wire.Operation], turns: Mapping[int, int]
) -> list[dict[str, Any]]:
    """The cycle's runs of consecutive samples of one turn: turn, seq ids, samples, sequences
    and tokens sampled (a retried or resampled episode starts again at turn 0)."""
    blocks: list[dict[str, Any]] = []
    for operation in sorted(operations, key=lambda op: op.seq_id):
        if operation.seq_id not in turns:
            continue
        turn = turns[operation.seq_id]
        sequences = (operation.result or {}).get("sequences", [])
        if not blocks or blocks[-1]["turn"] != turn:
            blocks.append(
                {
                    "turn": turn,
                    "seq_ids": [operation.seq_id] * 2,
                    "samples": 0,
                    "sequences": 0,
                    "sampled_tokens": 0,
                }
            )
        block = blocks[-1]
        block["seq_ids"][1] = operation.seq_id
        block["samples"] += 1
        block["sequences"] += len(sequences)
        block["sampled_tokens"] += sum(len(sequence.get("tokens", [])) for sequence in sequences)
    return blocks


def _sampler_name(operation: wire.Operation) -> str | None:
    name = (operation.result or {}).get("sampler_id")
    return name if isinstance(name, str) else None


def cycle_groups(operations: Iterable[wire.Operation]) -> list[CycleGroup]:
    """The run's journal split into cycles (see the module docstring)."""
    ordered = sorted(operations, key=lambda operation: operation.seq_id)
    if not any(op.kind == "save_weights_for_sampler" for op in ordered):
        return step_groups(ordered)
    groups: list[CycleGroup] = [CycleGroup("setup")]
    by_sampler: dict[str, CycleGroup] = {}
    unnamed = 0
    for operation in ordered:
        if operation.kind == "save_weights_for_sampler":
            name = _sampler_name(operation)
            match = CYCLE_SAMPLER.match(name or "")
            evaluation = EVAL_SAMPLER.match(name or "")
            if match is not None:
                groups.append(CycleGroup(f"cycle {match[1]}", int(match[1])))
            elif name is None or DEFAULT_SAMPLER.match(name):
                groups.append(CycleGroup(f"cycle {unnamed}", unnamed))
                unnamed += 1
            else:
                groups.append(CycleGroup(name, int(evaluation[1]) if evaluation else None))
            if evaluation is None and name is not None:
                by_sampler[name] = groups[-1]
        elif (
            operation.sampler_id in by_sampler
            and by_sampler[operation.sampler_id] is not groups[-1]
        ):
            # after an inline evaluation, the next cycle's samples: back to that cycle's group
            groups.append(groups.pop(groups.index(by_sampler[operation.sampler_id])))
        groups[-1].operations.append(operation)
    return split_final(groups)


def step_groups(ordered: Sequence[wire.Operation]) -> list[CycleGroup]:
    """A journal without samplers (SFT) in optimizer steps: `step N` from a forward_backward
    that follows an optim_step (or the first one) through what comes before the next (its
    optim_step, evals, a checkpoint); what precedes the first step is the `setup`."""
    groups: list[CycleGroup] = [CycleGroup("setup")]
    stepped = True
    for operation in ordered:
        if operation.kind == "forward_backward" and stepped:
            groups.append(CycleGroup(f"step {len(groups) - 1}"))
            stepped = False
        elif operation.kind == "optim_step":
            stepped = True
        groups[-1].operations.append(operation)
    return split_final(groups)


def split_final(groups: list[CycleGroup]) -> list[CycleGroup]:
    """The trailing save_state / export_lora of the run's normal end as the `final` group;
    empty groups dropped."""
    last = groups[-1]
    split = len(last.operations)
    while split > 0 and last.operations[split - 1].kind in FINAL_KINDS:
        split -= 1
    tail = last.operations[split:]
    if last.label != "setup" and split > 0 and any(op.kind == "export_lora" for op in tail):
        groups.append(CycleGroup("final", None, tail))
        del last.operations[split:]
    return [group for group in groups if group.operations]


# --------------------------------------------------------------------------- reports


def run_report(source: JournalSource, run_id: str, cycle: int | None = None) -> dict[str, Any]:
    """A run and its journal grouped in cycles (only cycle `cycle` if given), JSON-ready."""
    run = source.run(run_id)
    operations = source.operations(run_id)
    groups = cycle_groups(operations)
    usage: dict[str, dict[str, int]] = {}
    for operation in operations:
        add_usage(usage, {operation.kind: operation.usage})
    if cycle is not None:
        groups = [group for group in groups if group.cycle == cycle]
    prompts = source.sample_prompts(run_id) if groups else None
    if prompts:
        for group in groups:
            group.turns = sample_turns(group.operations, prompts)
    return {
        "run": run.model_dump(mode="json"),
        "operations": len(operations),
        "usage": usage,
        "tokens": total_tokens(usage),
        "cycles_in_journal": sorted(
            {group.cycle for group in cycle_groups(operations) if group.cycle is not None}
        ),
        "groups": [group.as_dict() for group in groups],
    }


def newest_first(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(items, key=lambda item: item["created_at"], reverse=True)


def runs_report(source: JournalSource) -> dict[str, Any]:
    """Every session with its runs and their status, newest first, JSON-ready."""
    sessions = []
    for session in source.sessions():
        runs = []
        for run_id in session.run_ids or []:
            run = source.run(run_id)
            runs.append(
                {
                    "run_id": run.run_id,
                    "role": run.role,
                    "trainable": run.trainable,
                    "provider": run.provider,
                    "base_model": run.base_model,
                    "status": run.status,
                    "step": run.step,
                    "operations": run.next_seq_id - 1,
                    "created_at": run.created_at,
                }
            )
        sessions.append(
            {
                "session_id": session.session_id,
                "status": session.status,
                "labels": session.labels,
                "created_at": session.created_at,
                "runs": newest_first(runs),
            }
        )
    return {"sessions": newest_first(sessions)}


# --------------------------------------------------------------------------- rendering


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
