"""Pipelining: a cycle waits only where it needs a result.

The page's loop waits for every answer in turn. A cycle needs only two of them: the samples
(build_loss reads them) and, at its end, the training results (its record). So a pipelined
cycle submits its tail (forward_backward, optim_step, the `save_state` checkpoint when one is
due, and the `save_weights_for_sampler` that publishes the next cycle's sampler) back to back
as task futures with consecutive seq ids, and waits for them together: one round trip instead
of three or four. The sampler is named `cycle-{n+1}`; with a name, the sampler id is known
before the answer (whitney-api.md), so the next cycle samples from it with no
save_weights_for_sampler call of its own. The first cycle a flow runs publishes its own.

The server executes a run's operations strictly in seq order, so the weights each sampler
snapshots, and therefore the samples and the adapter, are those of one call after another; only
the seq-id layout differs (a cycle's ids no longer start with its save_weights_for_sampler). A
retried cycle resubmits the same ids and replays.

One thing pipelining changes: operations are on the server before the one ahead of them has
answered. If that one is refused before it is journaled (a 4xx), its seq id stays a gap and
those behind it would wait out the server's gap timeout; if it fails in execution, they run
anyway. Neither can be repaired by a replay (the same request gets the same answer), so on a
non-retryable failure in the tail the cycle cancels the run (the operations waiting behind the
failure end at once) and fails; a retried flow run resumes from a checkpoint that precedes the
failure (`flows.core.resume`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger

from flows.core.checkpoints import checkpoint_name
from flows.core.sequenced_client import SequencedClient
from tasks.lifecycle import cancel_run
from tasks.retry import with_retry
from whitney import wire
from whitney.errors import WhitneyError
from whitney.payloads import result_sampler_id


def sampler_name(cycle: int) -> str:
    """The name of the sampler cycle `cycle` samples from, in a pipelined flow."""
    return f"cycle-{cycle}"


def publish_sampler(client: SequencedClient, run_id: str, cycle: int, named: bool) -> str:
    """save_weights_for_sampler for `cycle` at its start: named `cycle-{n}` (pipelined) or
    unnamed (the page's loop: the server names it); the sampler id."""
    payload = {"name": sampler_name(cycle)} if named else {}
    return result_sampler_id(client.run_operation(run_id, "save_weights_for_sampler", payload))


@dataclass(frozen=True)
class CycleTail:
    """What the end of a cycle produced."""

    backward: dict[str, Any]
    optimized: dict[str, Any]
    checkpoint: str | None
    """The `cycle-{n}` checkpoint URI, when one was due."""
    next_sampler_id: str | None
    """The sampler the next cycle samples from, when this cycle published it."""


def tail_calls(
    cycle: int,
    payload: dict[str, Any],
    optimizer: dict[str, Any],
    *,
    checkpoint: bool,
    publish_next: bool,
) -> list[tuple[str, dict[str, Any]]]:
    """The cycle's tail in seq order: forward_backward, optim_step, then the `cycle-{n}`
    save_state if `checkpoint`, then the `cycle-{n+1}` sampler if `publish_next`."""
    calls: list[tuple[str, dict[str, Any]]] = [
        ("forward_backward", payload),
        ("optim_step", {"optimizer": optimizer}),
    ]
    if checkpoint:
        calls.append(("save_state", {"name": checkpoint_name(cycle)}))
    if publish_next:
        calls.append(("save_weights_for_sampler", {"name": sampler_name(cycle + 1)}))
    return calls


def run_tail(
    client: SequencedClient,
    run_id: str,
    cycle: int,
    payload: dict[str, Any],
    optimizer: dict[str, Any],
    *,
    checkpoint: bool,
    pipelined: bool,
    last: bool,
) -> CycleTail:
    """The cycle's training tail: submitted together (`pipelined`, which also publishes the
    next cycle's sampler unless this cycle is the `last`) or one call after another."""
    calls = tail_calls(
        cycle, payload, optimizer, checkpoint=checkpoint, publish_next=pipelined and not last
    )
    if pipelined:
        results = submit_together(client, run_id, calls)
    else:
        results = [client.run_operation(run_id, kind, body) for kind, body in calls]
    by_kind = dict(zip((kind for kind, _ in calls), results, strict=True))
    return CycleTail(
        backward=by_kind["forward_backward"],
        optimized=by_kind["optim_step"],
        checkpoint=by_kind["save_state"]["checkpoint"] if "save_state" in by_kind else None,
        next_sampler_id=(
            result_sampler_id(by_kind["save_weights_for_sampler"])
            if "save_weights_for_sampler" in by_kind
            else None
        ),
    )


def submit_together(
    client: SequencedClient, run_id: str, calls: Sequence[tuple[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Submit run operations back to back as task futures (consecutive seq ids), then wait
    for each in order; their results. Each kind's log time is its wait after the previous
    one's answer, so the times add up to the tail's wall time, as sequential calls' would.

    On a non-retryable failure, the run is cancelled before the error propagates (see the
    module docstring): the operations submitted behind it end instead of waiting on a gap.
    """
    futures = [(kind, client.submit(run_id, kind, body)) for kind, body in calls]
    results: list[dict[str, Any]] = []
    for kind, future in futures:
        try:
            with client.log.timing(kind):
                operation: wire.Operation = future.result()
        except WhitneyError as error:
            if not error.retryable:
                cancel_behind_failure(client, run_id)
            raise
        client.log.record(operation)
        results.append(operation.result or {})
    return results


def cancel_behind_failure(client: SequencedClient, run_id: str) -> None:
    """Cancel the run whose pipelined tail failed for good, so nothing waits behind it."""
    try:
        with_retry(cancel_run, client.retry)(client.connection, run_id)
    except Exception as error:  # the cleanup hook cancels it too; the tail's error matters more
        get_run_logger().warning("Could not cancel Whitney run %s: %r", run_id, error)
