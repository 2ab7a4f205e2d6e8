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

from tasks.connection import WhitneyConnection, client_for
from tasks.retry import TaskRetrySettings
from whitney import wire

TASK_DEFAULTS: dict[str, Any] = {
    "cache_policy": NONE,
    "persist_result": False,
    **TaskRetrySettings().task_options(),
}


def _execute(
    connection: WhitneyConnection,
    run_id: str,
    kind: str,
    seq_id: int,
    payload: dict,
    sampler_id: str | None = None,
) -> wire.Operation:
    client = client_for(connection)
    return client.execute(run_id, kind, payload, seq_id=seq_id, sampler_id=sampler_id)


@task(
    name="save_weights_for_sampler",
    task_run_name="save_weights_for_sampler[seq={seq_id}]",
    **TASK_DEFAULTS,
)
def save_weights_for_sampler(
    connection: WhitneyConnection, run_id: str, seq_id: int, payload: dict
) -> wire.Operation:
    """Snapshot the run's weights for sampling; the result holds the `sampler_id`."""
    return _execute(connection, run_id, "save_weights_for_sampler", seq_id, payload)


@task(name="sample", task_run_name="sample[seq={seq_id}]", **TASK_DEFAULTS)
def sample(
    connection: WhitneyConnection, run_id: str, sampler_id: str, seq_id: int, payload: dict
) -> wire.Operation:
    """Sample completions of one prompt (a SampleRequest) from a sampler snapshot."""
    return _execute(connection, run_id, "sample", seq_id, payload, sampler_id)


@task(name="logprobs", task_run_name="logprobs[seq={seq_id}]", **TASK_DEFAULTS)
def logprobs(
    connection: WhitneyConnection, run_id: str, sampler_id: str, seq_id: int, payload: dict
) -> wire.Operation:
    """Per-token logprobs of given sequences under a sampler snapshot."""
    return _execute(connection, run_id, "logprobs", seq_id, payload, sampler_id)


@task(name="forward", task_run_name="forward[seq={seq_id}]", **TASK_DEFAULTS)
def forward(
    connection: WhitneyConnection, run_id: str, seq_id: int, payload: dict
) -> wire.Operation:
    """Loss and per-token outputs of a ForwardPayload, with no gradient."""
    return _execute(connection, run_id, "forward", seq_id, payload)


@task(name="forward_backward", task_run_name="forward_backward[seq={seq_id}]", **TASK_DEFAULTS)
def forward_backward(
    connection: WhitneyConnection, run_id: str, seq_id: int, payload: dict
) -> wire.Operation:
    """Loss of a ForwardPayload; its gradients accumulate until the next optim_step."""
    return _execute(connection, run_id, "forward_backward", seq_id, payload)


@task(name="optim_step", task_run_name="optim_step[seq={seq_id}]", **TASK_DEFAULTS)
def optim_step(
    connection: WhitneyConnection, run_id: str, seq_id: int, payload: dict
) -> wire.Operation:
    """Apply the accumulated gradients with the payload's optimizer; clears them."""
    return _execute(connection, run_id, "optim_step", seq_id, payload)


@task(name="save_state", task_run_name="save_state[seq={seq_id}]", **TASK_DEFAULTS)
def save_state(
    connection: WhitneyConnection, run_id: str, seq_id: int, payload: dict
) -> wire.Operation:
    """Checkpoint weights and optimizer state; the result holds the checkpoint URI."""
    return _execute(connection, run_id, "save_state", seq_id, payload)


@task(name="load_state", task_run_name="load_state[seq={seq_id}]", **TASK_DEFAULTS)
def load_state(
    connection: WhitneyConnection, run_id: str, seq_id: int, payload: dict
) -> wire.Operation:
    """Load a checkpoint (and optionally its optimizer state) into the run."""
    return _execute(connection, run_id, "load_state", seq_id, payload)


@task(name="export_lora", task_run_name="export_lora[seq={seq_id}]", **TASK_DEFAULTS)
def export_lora(
    connection: WhitneyConnection, run_id: str, seq_id: int, payload: dict
) -> wire.Operation:
    """Export the adapter (PEFT layout) as a downloadable artifact with its sha256."""
    return _execute(connection, run_id, "export_lora", seq_id, payload)


RUN_OPERATION_TASKS: dict[str, Task[..., wire.Operation]] = {
    "save_weights_for_sampler": save_weights_for_sampler,
    "forward": forward,
    "forward_backward": forward_backward,
    "optim_step": optim_step,
    "save_state": save_state,
    "load_state": load_state,
    "export_lora": export_lora,
}
"""Run operations by kind: `task(connection, run_id, seq_id, payload)`."""

SAMPLER_OPERATION_TASKS: dict[str, Task[..., wire.Operation]] = {
    "sample": sample,
    "logprobs": logprobs,
}
"""Sampler operations by kind: `task(connection, run_id, sampler_id, seq_id, payload)`."""
