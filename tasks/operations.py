"""One Prefect task per Whitney operation that takes a seq_id.

Every task is given its `seq_id` by the caller (a task never allocates one), so a retry, a
replayed cycle or a resumed flow sends exactly the same `(run_id, seq_id, kind, payload)` and
gets the journaled operation back. Each returns the terminal `wire.Operation` (result and
usage) and is named `{kind}[seq={seq_id}]` in the UI.

Tasks take the connection, not a client, and record nothing: `cache_policy=NONE` (no input
hashing) and no result persistence, so the API key inside the connection is never stored.
"""

from __future__ import annotations

from typing import Any

from prefect import Task, task
from prefect.cache_policies import NONE

from blocks.connection import WhitneyConnection, client_for
from tasks.calls import TaskRetrySettings
from whitney import wire

TASK_DEFAULTS: dict[str, Any] = {
    "cache_policy": NONE,
    "persist_result": False,
    **TaskRetrySettings().task_options(),
}


RUN_OPERATION_DOCS: dict[str, str] = {
    "save_weights_for_sampler": "Snapshot the run's weights for sampling; the result holds the "
    "`sampler_id`.",
    "forward": "Loss and per-token outputs of a ForwardPayload, with no gradient.",
    "forward_backward": "Loss of a ForwardPayload; its gradients accumulate until the next "
    "optim_step.",
    "optim_step": "Apply the accumulated gradients with the payload's optimizer; clears them.",
    "save_state": "Checkpoint weights and optimizer state; the result holds the checkpoint URI.",
    "load_state": "Load a checkpoint (and optionally its optimizer state) into the run.",
    "export_lora": "Export the adapter (PEFT layout) as a downloadable artifact with its sha256.",
}
SAMPLER_OPERATION_DOCS: dict[str, str] = {
    "sample": "Sample completions of one prompt (a SampleRequest) from a sampler snapshot.",
    "logprobs": "Per-token logprobs of given sequences under a sampler snapshot.",
}


def execute_operation(
    connection: WhitneyConnection,
    run_id: str,
    kind: str,
    seq_id: int,
    payload: dict,
    sampler_id: str | None = None,
) -> wire.Operation:
    """What every operation task runs: the call on seq id `seq_id`, until it is terminal."""
    client = client_for(connection)
    return client.execute(run_id, kind, payload, seq_id=seq_id, sampler_id=sampler_id)


def operation_task(fn: Any, kind: str, doc: str) -> Task[..., wire.Operation]:
    """`fn` as the task of `kind`: named `kind`, its runs `{kind}[seq={seq_id}]`."""
    fn.__name__ = fn.__qualname__ = kind
    fn.__doc__ = doc
    return task(name=kind, task_run_name=f"{kind}[seq={{seq_id}}]", **TASK_DEFAULTS)(fn)


def run_operation_task(kind: str, doc: str) -> Task[..., wire.Operation]:
    """The task of a run operation: `task(connection, run_id, seq_id, payload)`."""

    def run_operation(
        connection: WhitneyConnection, run_id: str, seq_id: int, payload: dict
    ) -> wire.Operation:
        return execute_operation(connection, run_id, kind, seq_id, payload)

    return operation_task(run_operation, kind, doc)


def sampler_operation_task(kind: str, doc: str) -> Task[..., wire.Operation]:
    """The task of a sampler operation: `task(connection, run_id, sampler_id, seq_id, payload)`."""

    def sampler_operation(
        connection: WhitneyConnection, run_id: str, sampler_id: str, seq_id: int, payload: dict
    ) -> wire.Operation:
        return execute_operation(connection, run_id, kind, seq_id, payload, sampler_id)

    return operation_task(sampler_operation, kind, doc)


RUN_OPERATION_TASKS: dict[str, Task[..., wire.Operation]] = {
    kind: run_operation_task(kind, doc) for kind, doc in RUN_OPERATION_DOCS.items()
}
"""Run operations by kind: `task(connection, run_id, seq_id, payload)`."""
SAMPLER_OPERATION_TASKS: dict[str, Task[..., wire.Operation]] = {
    kind: sampler_operation_task(kind, doc) for kind, doc in SAMPLER_OPERATION_DOCS.items()
}
"""Sampler operations by kind: `task(connection, run_id, sampler_id, seq_id, payload)`."""


@task(
    name="requested_earlier",
    task_run_name="requested_earlier[seq={seq_start}..+{count}]",
    **TASK_DEFAULTS,
)
def requested_earlier(
    connection: WhitneyConnection, run_id: str, seq_start: int, count: int
) -> list[wire.Operation]:
    """The `count` operations an earlier cycle submitted from seq id `seq_start` (it waited
    for them: they are terminal), read from the run's journal; nothing is sent again."""
    client = client_for(connection)
    operations = client.journal(run_id, after_seq=seq_start - 1, limit=count)
    found = [operation.seq_id for operation in operations]
    if found != list(range(seq_start, seq_start + count)):
        raise ValueError(
            f"run {run_id}: expected operations {seq_start}..{seq_start + count - 1} in the "
            f"journal, found {found}"
        )
    return operations
