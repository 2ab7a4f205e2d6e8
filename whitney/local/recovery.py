"""Rebuilding an active run after the server restarted, from its journal alone.

A run the previous process left `ready` or `finishing` lost what lived in memory (weights,
optimizer moments, accumulated gradients, sampler snapshots), not its journal. That state is a
function of the run's succeeded operations, so it is rebuilt by running them again:

- the base is the run's creation (`from_checkpoint` included) or, when there is one, the
  latest `save_state` of the run that holds its whole training state (no gradient accumulated
  since the last `optim_step` or `load_state`) and whose earlier samplers are on disk
  (`save_weights_for_sampler` writes every snapshot);
- from the base, the succeeded `forward_backward`, `optim_step`, `save_weights_for_sampler`
  and `load_state` run again in seq order. The engine is deterministic and batch-invariant, so
  each gives the result it gave before: every replayed result is compared with the journaled
  text, and a difference stops the rebuild (`ReplayDiverged`) rather than serve other weights;
- the operations that never finished (pending, or running when the process died) are queued
  again behind the rebuilt frontier, and run once.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whitney.errors import InternalError
from whitney.local import tinker_provider
from whitney.local.execution import (
    Engine,
    RunHooks,
    Ticket,
    default_sampler_id,
    default_state_name,
)
from whitney.local.journal import fast_json

STATEFUL_KINDS = ("forward_backward", "optim_step", "save_weights_for_sampler", "load_state")
"""The operations whose effect lives in the engine's memory: what a rebuild runs again."""
TERMINAL = ("succeeded", "failed", "cancelled")


class ReplayDiverged(InternalError):
    """A replayed operation gave another result than the journaled one."""


@dataclass(frozen=True)
class Rebuilt:
    """A run's engine rebuilt from its journal, and the queue its worker resumes with."""

    engine: Engine
    frontier: int
    tickets: list[Ticket]
    terminal_ahead: set[int]
    samplers: set[str]
    base_seq_id: int | None  # the save_state rebuilt from; None: the run's creation
    replayed: int  # operations run again


def sampler_of(row: sqlite3.Row) -> str:
    """The sampler id a `save_weights_for_sampler` row published."""
    return json.loads(row["payload"]).get("name") or default_sampler_id(row["seq_id"])


def checkpoint_of(row: sqlite3.Row) -> str:
    """The checkpoint name a `save_state` row wrote."""
    return json.loads(row["payload"]).get("name") or default_state_name(row["seq_id"])


def replay_base(
    rows: list[sqlite3.Row],
    sampler_on_disk: Callable[[str], bool],
    state_on_disk: Callable[[str], bool],
) -> int | None:
    """The seq_id of the latest `save_state` a rebuild can start from, or None (creation)."""
    base, pending_gradient, samplers_on_disk = None, False, True
    for row in rows:
        if row["status"] != "succeeded":
            continue
        kind = row["kind"]
        if kind == "forward_backward":
            pending_gradient = True
        elif kind in ("optim_step", "load_state"):
            pending_gradient = False
        elif kind == "save_weights_for_sampler":
            samplers_on_disk = samplers_on_disk and sampler_on_disk(sampler_of(row))
        elif kind == "save_state" and not pending_gradient and samplers_on_disk:
            base = row["seq_id"] if state_on_disk(checkpoint_of(row)) else base
    return base


def rebuild(
    run: dict[str, Any],
    rows: list[sqlite3.Row],
    engine_module: Any,
    hooks: RunHooks,
    interrupt: threading.Event,
    hf_cache: Path | None = None,
) -> Rebuilt:
    """The run's engine as its succeeded operations left it, and its queue (a Hugging Face
    base model from `hf_cache`, as the server created it). Setting `interrupt` stops the
    rebuild (`OperationCancelled`)."""
    run_id, tenant = run["run_id"], run["tenant"]
    if run.get("trained_at"):
        return reconnect(run, rows, hooks)
    start = run["from_checkpoint"]
    engine = engine_module.EngineRun.create(
        base_model=run["base_model"],
        lora_rank=run["lora_rank"],
        seed=run["seed"],
        role=run["role"],
        trainable=run["trainable"],
        checkpoint_dir=None if start is None else hooks.resolve_checkpoint(tenant, start),
        hf_cache=hf_cache,
    )
    engine.interrupt = interrupt
    base = replay_base(
        rows,
        lambda sampler_id: hooks.sampler_path(run_id, sampler_id).is_file(),
        lambda name: hooks.state_dir(run_id, name).is_dir(),
    )
    replayed = 0
    for row in rows:
        if row["status"] != "succeeded":
            continue
        seq_id, kind = row["seq_id"], row["kind"]
        if base is not None and seq_id < base:
            if kind == "save_weights_for_sampler":
                sampler_id = sampler_of(row)
                engine.read_sampler(sampler_id, hooks.sampler_path(run_id, sampler_id))
        elif seq_id == base:
            engine.restore(hooks.state_dir(run_id, checkpoint_of(row)), with_optimizer=True)
        elif kind in STATEFUL_KINDS:
            _replay(engine, row, run, hooks)
            replayed += 1
    return queued(engine, rows, base, replayed)


def queued(engine: Engine, rows: list[sqlite3.Row], base: int | None, replayed: int) -> Rebuilt:
    """`engine` rebuilt, with the run's queue: its operations not terminal, queued again."""
    terminal = {row["seq_id"] for row in rows if row["status"] in TERMINAL}
    frontier = 1
    while frontier in terminal:
        frontier += 1
    tickets = [
        Ticket(
            seq_id=row["seq_id"],
            kind=row["kind"],
            sampler_id=row["sampler_id"],
            payload=json.loads(row["payload"]),
            submitted_at=row["submitted_at"],
        )
        for row in rows
        if row["status"] not in TERMINAL
    ]
    return Rebuilt(
        engine=engine,
        frontier=frontier,
        tickets=tickets,
        terminal_ahead={seq_id for seq_id in terminal if seq_id > frontier},
        samplers=set(engine.samplers),
        base_seq_id=base,
        replayed=replayed,
    )


def reconnect(run: dict[str, Any], rows: list[sqlite3.Row], hooks: RunHooks) -> Rebuilt:
    """A forwarded run's Tinker model, reached again (nothing replayed: its state is
    Tinker's), and its queue: an operation sent before the restart is sent again under its
    recorded Tinker request ids, which the Tinker side answers from its record."""
    run_id = run["run_id"]
    samplers = {}
    for row in rows:
        if row["status"] == "succeeded" and row["kind"] == "save_weights_for_sampler":
            sampler_id = sampler_of(row)
            saved = json.loads(hooks.sampler_path(run_id, sampler_id).read_text())
            samplers[sampler_id] = saved["model_path"]
    engine = tinker_provider.TinkerRun.reconnect(
        hooks.tinker_record(run_id), step=int(run["step"]), sampler_paths=samplers
    )
    return queued(engine, rows, None, 0)


def _replay(engine: Any, row: sqlite3.Row, run: dict[str, Any], hooks: RunHooks) -> None:
    """Run one succeeded stateful operation again; `ReplayDiverged` unless its result is the
    journaled one."""
    payload = json.loads(row["payload"])
    kind = row["kind"]
    if kind == "forward_backward":
        output = engine.forward(payload, backward=True)
    elif kind == "optim_step":
        output = engine.optim_step(payload["optimizer"])
    elif kind == "save_weights_for_sampler":
        sampler_id = sampler_of(row)
        output = engine.save_weights_for_sampler(sampler_id)
        path = hooks.sampler_path(run["run_id"], sampler_id)
        if not path.is_file():  # a journal written before snapshots were kept on disk
            engine.write_sampler(sampler_id, path)
    else:
        directory = hooks.resolve_checkpoint(run["tenant"], payload["checkpoint"])
        output = engine.load_state(directory, with_optimizer=payload.get("with_optimizer", True))
    if fast_json(output.result) != row["result"]:
        raise ReplayDiverged(
            f"replaying {kind} at seq_id {row['seq_id']} of run {run['run_id']} gave another "
            "result than the journaled one",
            details={"run_id": run["run_id"], "seq_id": row["seq_id"], "kind": kind},
        )
