"""Prefect tasks for the Whitney calls around the operations: capabilities, sessions and run
lifecycle.

Creation calls carry idempotency keys chosen by the flow, so a retried task (or a retried
POST inside the client) never opens a second session or run. Finish, cancel and close are
idempotent on the server.
"""

from __future__ import annotations

from prefect import task

from blocks.connection import WhitneyConnection, client_for
from tasks.operations import TASK_DEFAULTS
from whitney import wire


@task(name="capabilities", **TASK_DEFAULTS)
def capabilities(connection: WhitneyConnection) -> wire.Capabilities:
    """What the Whitney serves: its providers, their base models and operations, its limits."""
    return client_for(connection).capabilities()


@task(name="open_session", **TASK_DEFAULTS)
def open_session(
    connection: WhitneyConnection, labels: dict[str, str], idempotency_key: str
) -> wire.Session:
    """Open a session bearing `labels` (the flows label it with their flow run id)."""
    return client_for(connection).open_session(labels, idempotency_key=idempotency_key)


@task(name="create_run", **TASK_DEFAULTS)
def create_run(
    connection: WhitneyConnection,
    session_id: str,
    provider: str,
    base_model: str,
    *,
    lora_rank: int,
    seed: int | None,
    idempotency_key: str,
    role: str = "policy",
    trainable: bool = True,
    from_checkpoint: str | None = None,
    labels: dict[str, str] | None = None,
) -> wire.Run:
    """Create a run in the session (a policy by default; a critic or a frozen reference
    with `role` / `trainable`)."""
    return client_for(connection).create_run(
        session_id,
        provider,
        base_model,
        lora_rank=lora_rank,
        seed=seed,
        role=role,
        trainable=trainable,
        from_checkpoint=from_checkpoint,
        labels=labels,
        idempotency_key=idempotency_key,
    )


@task(name="finish_run", **TASK_DEFAULTS)
def finish_run(connection: WhitneyConnection, run_id: str) -> wire.Run:
    """Drain the run's queued operations, then mark it finished."""
    return client_for(connection).finish(run_id)


@task(name="close_session", **TASK_DEFAULTS)
def close_session(connection: WhitneyConnection, session_id: str) -> wire.Session:
    """Close the session (the server cancels any run still open in it)."""
    return client_for(connection).close_session(session_id)
