"""Auxiliary runs: the runs a recipe declares beside the policy (a critic, a frozen
reference), created in the flow's session from the same provider and base model.

Each has its own seq ids. A cycle takes them from its ledger, which starts every auxiliary run
at the position the previous cycle ended at (`CycleMetrics.auxiliary_seq_end`), exactly like
the policy's, so a replayed cycle makes the same calls with the same ids on every run. A
reference run publishes its one sampler (named after the run) when it is created: its weights
never change, so every cycle reads logprobs from it without another call.

The cleanup hooks cancel every run of the flow's sessions, so auxiliary runs need nothing more
on failure; on success they are finished before the session closes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel

from flows.core.loop.training import TrainingRun
from flows.rl.recipes import Recipe
from tasks.names import AUXILIARY_LABEL, cycle_name
from tasks.operations import SeqLedger, SequencedClient
from whitney import wire


class AuxiliaryHandle(BaseModel):
    """An auxiliary run as the cycles see it: what it is, and the seq id its next call gets."""

    name: str
    run_id: str
    role: str
    trainable: bool
    sampler_id: str | None
    seq_start: int


def open_auxiliary_runs(
    training: TrainingRun, recipe: Recipe, checkpoints: Mapping[str, str] | None = None
) -> list[AuxiliaryHandle]:
    """Create the recipe's auxiliary runs in the training run's session (idempotent per flow
    run attempt and name); a reference run's sampler is published right away. `checkpoints`:
    by run name, where a resumed flow's trainable runs (a critic) continue from
    (tasks.resume)."""
    handles = []
    for spec in recipe.auxiliary_runs:
        run = training.add_run(
            spec.name,
            role=spec.role,
            trainable=spec.trainable,
            labels={AUXILIARY_LABEL: spec.name},
            from_checkpoint=(checkpoints or {}).get(spec.name) if spec.trainable else None,
        )
        client = training.client({run.run_id: run.next_seq_id})
        sampler_id = None
        if spec.sampler:
            published = client.execute(run.run_id, "save_weights_for_sampler", {"name": spec.name})
            sampler_id = published.result_as(wire.SamplerResult).sampler_id
        handles.append(
            AuxiliaryHandle(
                name=spec.name,
                run_id=run.run_id,
                role=spec.role,
                trainable=spec.trainable,
                sampler_id=sampler_id,
                seq_start=client.ledger.position(run.run_id),
            )
        )
    return handles


def ledger_starts(handles: Iterable[AuxiliaryHandle]) -> dict[str, int]:
    """The auxiliary runs' entries of a cycle's SeqLedger."""
    return {handle.run_id: handle.seq_start for handle in handles}


def seq_ends(handles: Iterable[AuxiliaryHandle], ledger: SeqLedger) -> dict[str, int]:
    """Where each auxiliary run's next cycle starts, by name, once this cycle is done."""
    return {handle.name: ledger.position(handle.run_id) for handle in handles}


def save_auxiliary_checkpoints(
    client: SequencedClient, handles: Iterable[AuxiliaryHandle], cycle: int
) -> dict[str, str]:
    """save_state `cycle-{n}` on every trainable auxiliary run (a critic's value head and
    optimizer), so a resume restores it with the policy; the checkpoints by run name."""
    return {
        handle.name: client.execute(handle.run_id, "save_state", {"name": cycle_name(cycle)})
        .result_as(wire.SaveStateResult)
        .checkpoint
        for handle in handles
        if handle.trainable
    }
