"""What the checkpoint flows (evaluate-checkpoint, promote-checkpoint) read on Whitney: the run
that saved a checkpoint, and every checkpoint a run saved."""

from __future__ import annotations

from prefect import task

from blocks.connection import WhitneyConnection, client_for
from tasks.operations import TASK_DEFAULTS
from whitney import wire
from whitney.client import WhitneyClient


def saved_checkpoints(client: WhitneyClient, run_id: str) -> list[str]:
    """The checkpoint URIs of the run's succeeded `save_state` operations, in seq order (a
    training flow's `cycle-{n}` ones, then its final one)."""
    return [
        str(operation.result["checkpoint"])
        for operation in client.iter_journal(run_id)
        if operation.kind == "save_state"
        and operation.status == "succeeded"
        and (operation.result or {}).get("checkpoint")
    ]


@task(name="read_run", **TASK_DEFAULTS)
def read_run(connection: WhitneyConnection, run_id: str) -> wire.Run:
    """The run (its provider, base model and LoRA rank, to create runs from its checkpoints)."""
    return client_for(connection).get_run(run_id)


@task(name="list_checkpoints", **TASK_DEFAULTS)
def list_checkpoints(connection: WhitneyConnection, run_id: str) -> list[str]:
    """Every checkpoint the run saved, in order."""
    return saved_checkpoints(client_for(connection), run_id)
