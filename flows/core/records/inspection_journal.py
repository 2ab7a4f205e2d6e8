"""What happened in cycle N: a run's journal, read from a source
(`flows.core.records.inspection_sources`), decoded into cycles and turns, as JSON-ready reports
(`flows.cli.inspection` renders them).

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
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flows.core.loop.cost import add_usage, total_tokens
from flows.core.records.inspection_sources import JournalSource
from tasks.names import CYCLE_SAMPLER, EVAL_SAMPLER
from whitney import wire

DEFAULT_SAMPLER = re.compile(r"^sampler-\d+$")
FINAL_KINDS = frozenset({"save_state", "export_lora"})


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


# One journal operation as a row: its timings, usage and key metrics, and their text.


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _seconds(start: Any, end: Any) -> float | None:
    begin, finish = parse_time(start), parse_time(end)
    if begin is None or finish is None:
        return None
    return round((finish - begin).total_seconds(), 6)


def _extra(operation: wire.Operation, name: str) -> Any:
    return (operation.model_extra or {}).get(name)


def duration_s(operation: wire.Operation) -> float | None:
    """Execution time on the server: started_at to finished_at."""
    return _seconds(_extra(operation, "started_at"), operation.finished_at)


def queued_s(operation: wire.Operation) -> float | None:
    """Time between being journaled and starting to run (waiting for earlier seq ids)."""
    return _seconds(operation.submitted_at, _extra(operation, "started_at"))


def _rounded(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def key_metrics(operation: wire.Operation) -> dict[str, Any]:
    """The few numbers of an operation's result worth a glance, by kind."""
    result = operation.result or {}
    kind = operation.kind
    metrics: dict[str, Any] = {}
    if kind in ("forward_backward", "forward"):
        metrics["loss"] = result.get("loss")
        inner = result.get("metrics") or {}
        for name in ("tokens:sum", "kl_sample_train:mean", "clip_fraction:mean"):
            if name in inner:
                metrics[name] = inner[name]
        metrics["datums"] = len(result.get("outputs") or [])
    elif kind == "optim_step":
        inner = result.get("metrics") or {}
        metrics = {"step": result.get("step")} | {
            name: inner[name] for name in ("grad_norm", "learning_rate") if name in inner
        }
    elif kind == "save_weights_for_sampler":
        metrics["sampler_id"] = result.get("sampler_id")
    elif kind == "sample":
        sequences = result.get("sequences") or []
        lengths = [len(sequence.get("tokens") or []) for sequence in sequences]
        metrics["sequences"] = len(sequences)
        metrics["prompt_tokens"] = result.get("prompt_tokens")
        if lengths:
            metrics["mean_length"] = sum(lengths) / len(lengths)
            stopped = sum(sequence.get("stop_reason") == "stop" for sequence in sequences)
            metrics["stopped"] = stopped / len(sequences)
    elif kind == "logprobs":
        metrics["sequences"] = len(result.get("logprobs") or [])
    elif kind in ("save_state", "load_state"):
        metrics = {name: result[name] for name in ("checkpoint", "step") if name in result}
    elif kind == "export_lora":
        metrics = {
            name: result[name] for name in ("artifact_id", "sha256", "bytes") if name in result
        }
    if operation.error:
        metrics["error"] = f"{operation.error.get('type')}: {operation.error.get('message')}"
    return {name: _rounded(value) for name, value in metrics.items() if value is not None}


def operation_row(operation: wire.Operation) -> dict[str, Any]:
    """One operation as a flat record: what `inspect` prints and `--json` holds."""
    return {
        "seq_id": operation.seq_id,
        "kind": operation.kind,
        "sampler_id": operation.sampler_id,
        "status": operation.status,
        "duration_s": duration_s(operation),
        "queued_s": queued_s(operation),
        "submitted_at": operation.submitted_at,
        "started_at": _extra(operation, "started_at"),
        "finished_at": operation.finished_at,
        "usage": {name: int(value) for name, value in operation.usage.items()},
        "metrics": key_metrics(operation),
    }


def seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def metrics_text(metrics: Mapping[str, Any]) -> str:
    parts = []
    for name, value in metrics.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif name == "sha256" and isinstance(value, str):
            value = value[:16] + "…"
        parts.append(f"{name}={value}")
    return " ".join(parts)
