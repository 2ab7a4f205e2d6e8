"""A flow's calls to Whitney, in one place: one Prefect task per Whitney operation that takes a
seq_id, a task run on the flow's connection with its retry policy (`WhitneyCalls`), and the
ordered calls every flow makes (`SequencedClient`).

Every operation task is given its `seq_id` by the caller (a task never allocates one), so a
retry, a replayed cycle or a resumed flow sends exactly the same `(run_id, seq_id, kind,
payload)` and gets the journaled operation back. Each returns the terminal `wire.Operation`
(result and usage) and is named `{kind}[seq={seq_id}]` in the UI. Tasks take the connection,
not a client, and record nothing: `cache_policy=NONE` (no input hashing) and no result
persistence, so the API key inside the connection is never stored.

Any Whitney task (`tasks.lifecycle`, ...) runs on the flow's connection with the flow's retry
policy (`tasks.retry.TaskRetrySettings`):

    whitney = WhitneyCalls(connection, config.task_retry)
    session = whitney.run(open_session, labels, idempotency_key)
    future = whitney.submit(sample, run_id, sampler_id, seq_id, payload)

A retried task resends the same seq_id, so the server answers with the stored operation
instead of running it again: retrying is always safe, never double-applies.

`ctx.client` (flows.rl.recipes.context) is a `SequencedClient`: it looks like the client of
Whitney's Loop building blocks (`run_operation`, `sampler_operation`), but every call is a
retried Prefect task whose seq id comes from the cycle's `SeqLedger`: extra calls a recipe
makes take the next ids in order, so a replayed cycle makes them again with the same ids. The
flows make their calls through the same object, one at a time (`execute`), as a block
submitted together (`run_block`: the one way every flow and task runner submits concurrent
operations), or either, by a flag (`run_calls`).

Seq ids: a `SeqLedger` (`whitney.seq_ids`, the SDK client's allocator too) hands out each
run's ids in order from a known start. A cycle starts at the id where the previous one ended
and allocates in a deterministic order (a block reserves all its ids before anything is
submitted), so a replayed cycle makes the same calls with the same ids: completed operations
come back from the server's journal, the rest run once. Allocate from the cycle's own thread
only. Every answer goes into the client's `OperationLog` (the cycle's record: wall time and
billed usage per kind).

Payloads go to the tasks `quote`d on the thread pool, so Prefect does not walk them looking
for futures (for a forward_backward payload of 64 datums that walk alone cost about 0.1 s per
call); on Dask, whose serialisation of task arguments turns `quote` into a plain tuple, as is.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from blocks.connection import WhitneyConnection, client_for
from tasks.retry import TaskRetrySettings
from whitney import wire
from whitney.errors import OperationFailed, WhitneyError
from whitney.seq_ids import SeqLedger

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


@task(name="cancel_run", **TASK_DEFAULTS)
def cancel_run(connection: WhitneyConnection, run_id: str) -> wire.Run:
    """Cancel the run; its pending operations become cancelled."""
    return client_for(connection).cancel(run_id)


@functools.cache
def with_retry(task: Task[..., Any], settings: TaskRetrySettings) -> Task[..., Any]:
    """`task` with this retry policy (one copy per task and policy, made on first use)."""
    return task.with_options(**settings.task_options())


@dataclass(frozen=True)
class WhitneyCalls:
    """Whitney tasks on one connection, each with one retry policy."""

    connection: WhitneyConnection
    retry: TaskRetrySettings

    def task(self, task: Task[..., Any]) -> Task[..., Any]:
        """`task` with this retry policy."""
        return with_retry(task, self.retry)

    def run(self, task: Task[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `task` on the connection in this thread; its result."""
        return self.task(task)(self.connection, *args, **kwargs)

    def submit(self, task: Task[..., Any], *args: Any, **kwargs: Any) -> PrefectFuture[Any]:
        """Submit `task` on the connection to the task runner; its future."""
        return self.task(task).submit(self.connection, *args, **kwargs)


class OperationLog:
    """The operations of one cycle (or a flow's own calls), with wall seconds and `usage`
    counters per operation kind."""

    def __init__(self) -> None:
        self.operations: list[wire.Operation] = []
        self.seconds: dict[str, float] = defaultdict(float)
        self.usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    @contextmanager
    def timing(self, kind: str) -> Iterator[None]:
        """Add the wall time of the `with` block to `kind`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[kind] += time.perf_counter() - started

    def record(self, operation: wire.Operation) -> None:
        """Keep the operation and add its usage counters to its kind."""
        self.operations.append(operation)
        for name, value in operation.usage.items():
            self.usage[operation.kind][name] += int(value)

    def tokens(self, kind: str, counter: str = "tokens") -> int:
        """Billed `counter` of `kind` so far (falling back to plain `tokens`)."""
        usage = self.usage.get(kind, {})
        return int(usage.get(counter, usage.get("tokens", 0)))


class Call(NamedTuple):
    """One operation of a block: a run operation, or a sampler operation on `sampler_id`."""

    kind: str
    payload: dict[str, Any]
    sampler_id: str | None = None


class Submitted(NamedTuple):
    """A block's calls on their run, as task futures in seq order."""

    run_id: str
    calls: Sequence[Call]
    futures: Sequence[PrefectFuture[wire.Operation]]
    seq_ids: range


def _task_for(kind: str, sampler_id: str | None) -> Task[..., Any]:
    tasks = RUN_OPERATION_TASKS if sampler_id is None else SAMPLER_OPERATION_TASKS
    if kind not in tasks:
        route = "run" if sampler_id is None else "sampler"
        raise ValueError(f"{kind!r} is not a {route} operation (known: {', '.join(tasks)})")
    return tasks[kind]


def task_payload(payload: dict[str, Any]) -> Any:
    """The payload as a task argument: `quote`d on the thread pool, as is on Dask."""
    runner = getattr(FlowRunContext.get(), "task_runner", None)
    if runner is None or isinstance(runner, ThreadPoolTaskRunner):  # outside a flow: threads
        return quote(payload)
    return payload


class SequencedClient:
    """Ordered Whitney calls: seq ids from the ledger, each call a task, each answer logged."""

    def __init__(
        self,
        connection: WhitneyConnection,
        starts: Mapping[str, int],
        retry: TaskRetrySettings,
        log: OperationLog | None = None,
    ) -> None:
        self.connection = connection
        self.ledger = SeqLedger(starts)
        self.retry = retry
        self.whitney = WhitneyCalls(connection, retry)
        self.log = log if log is not None else OperationLog()

    def execute(
        self,
        run_id: str,
        kind: str,
        payload: dict,
        *,
        seq_id: int | None = None,
        sampler_id: str | None = None,
    ) -> wire.Operation:
        """Run one operation (seq id: the given one, else the ledger's next), timed and
        recorded in the log."""
        seq = self.ledger.next(run_id) if seq_id is None else seq_id
        with self.log.timing(kind):
            operation = self.call(run_id, kind, payload, seq, sampler_id)
        self.log.record(operation)
        return operation

    def call(
        self, run_id: str, kind: str, payload: dict, seq_id: int, sampler_id: str | None
    ) -> wire.Operation:
        """One operation on seq id `seq_id`, as a Prefect task run in this thread."""
        route = () if sampler_id is None else (sampler_id,)
        return self.whitney.run(_task_for(kind, sampler_id), run_id, *route, seq_id, quote(payload))

    def run_operation(
        self, run_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict:
        """Loop building blocks' `client.run_operation`: the operation's result."""
        return self.execute(run_id, kind, payload, seq_id=seq_id).result or {}

    def sampler_operation(
        self, run_id: str, sampler_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict:
        """Loop building blocks' `client.sampler_operation`: the operation's result."""
        operation = self.execute(run_id, kind, payload, seq_id=seq_id, sampler_id=sampler_id)
        return operation.result or {}

    def submit(self, run_id: str, calls: Sequence[Call]) -> Submitted:
        """Reserve a block of the run's seq ids for `calls` (allocated now, in order) and
        submit them all as tasks: the task runner runs them concurrently; the server
        executes them in seq order, so their results are those of one call after another."""
        seq_ids = self.ledger.reserve(run_id, len(calls))
        futures = []
        for seq, call in zip(seq_ids, calls, strict=True):
            task = _task_for(call.kind, call.sampler_id)
            route = () if call.sampler_id is None else (call.sampler_id,)
            payload = task_payload(call.payload)
            futures.append(self.whitney.submit(task, run_id, *route, seq, payload))
        return Submitted(run_id, calls, futures, seq_ids)

    def collect(self, submitted: Submitted) -> list[wire.Operation]:
        """The block's operations, waited for in seq order and recorded in the log; each
        wait is timed under its kind, so the times add up to the block's wall time.

        On a non-retryable failure the run is cancelled before the error propagates: the
        calls behind a refused one would otherwise wait out the server's gap timeout, and a
        replay cannot repair it (the same request gets the same answer).
        """
        operations = []
        for call, future in zip(submitted.calls, submitted.futures, strict=True):
            try:
                with self.log.timing(call.kind):
                    operation = future.result()
            except WhitneyError as error:
                if not error.retryable:
                    self.cancel_behind_failure(submitted.run_id)
                raise
            self.log.record(operation)
            operations.append(operation)
        return operations

    def run_block(self, run_id: str, calls: Sequence[Call]) -> list[wire.Operation]:
        """`calls` submitted together on a reserved block of seq ids; their operations."""
        return self.collect(self.submit(run_id, calls))

    def run_calls(self, run_id: str, calls: Sequence[Call], together: bool) -> list[wire.Operation]:
        """`calls` on the run's next seq ids: submitted together as one block (`together`) or
        one after another; the same ids and, the server executing in seq order, the same
        results either way."""
        if together:
            return self.run_block(run_id, calls)
        return [
            self.execute(run_id, call.kind, call.payload, sampler_id=call.sampler_id)
            for call in calls
        ]

    def read_block(
        self, run_id: str, seq_start: int, calls: Sequence[Call]
    ) -> list[wire.Operation]:
        """The operations an earlier cycle submitted for `calls` from `seq_start` (and
        waited for), read from the journal: not sent again, not billed again, not logged
        again; OperationFailed if one did not succeed."""
        with self.log.timing(calls[0].kind if calls else "sample"):
            operations = self.whitney.run(requested_earlier, run_id, seq_start, len(calls))
        for call, operation in zip(calls, operations, strict=True):
            if (operation.kind, operation.sampler_id) != (call.kind, call.sampler_id):
                raise ValueError(
                    f"run {run_id} seq {operation.seq_id}: journaled {operation.kind} on "
                    f"{operation.sampler_id!r}, expected {call.kind} on {call.sampler_id!r}"
                )
            if operation.status != "succeeded":
                raise OperationFailed(
                    f"{operation.kind}[seq={operation.seq_id}] on run {run_id} ended "
                    f"{operation.status}",
                    type=(operation.error or {}).get("type", "operation_failed"),
                )
        return operations

    def cancel_behind_failure(self, run_id: str) -> None:
        """Cancel the run whose block failed for good, so nothing waits behind the failure."""
        try:
            self.whitney.run(cancel_run, run_id)
        except Exception as error:  # the cleanup hook cancels it too; the block's error matters
            get_run_logger().warning("Could not cancel Whitney run %s: %r", run_id, error)
