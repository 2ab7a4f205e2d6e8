"""`ctx.client` (flows.rl.recipes.context) and every flow's ordered Whitney calls.

`ctx.client` looks like the page's client (`run_operation`, `sampler_operation`), but every
call is a retried Prefect task whose seq id comes from the cycle's `SeqLedger`: extra calls a
recipe makes take the next ids in order, so a replayed cycle makes them again with the same
ids. The cycle itself makes its calls through the same object.

Payloads go to the tasks `quote`d, so Prefect does not walk them looking for futures: for a
forward_backward payload of 64 datums that walk alone cost about 0.1 s per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect import Task
from prefect.futures import PrefectFuture, wait
from prefect.utilities.annotations import quote

from flows.core.operation_log import OperationLog
from flows.core.sequencing import SeqLedger
from tasks.connection import WhitneyConnection
from tasks.operations import RUN_OPERATION_TASKS, SAMPLER_OPERATION_TASKS
from tasks.retry import TaskRetrySettings, with_retry
from whitney import wire


def _task_for(kind: str, sampler_id: str | None, retry: TaskRetrySettings) -> Task[..., Any]:
    tasks = RUN_OPERATION_TASKS if sampler_id is None else SAMPLER_OPERATION_TASKS
    if kind not in tasks:
        route = "run" if sampler_id is None else "sampler"
        raise ValueError(f"{kind!r} is not a {route} operation (known: {', '.join(tasks)})")
    return with_retry(tasks[kind], retry)


class SequencedClient:
    """Ordered Whitney calls for one cycle: seq ids from the ledger, each call a task."""

    def __init__(
        self,
        connection: WhitneyConnection,
        ledger: SeqLedger,
        retry: TaskRetrySettings,
        log: OperationLog,
    ) -> None:
        self.connection = connection
        self.ledger = ledger
        self.retry = retry
        self.log = log

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
        """One operation on seq id `seq_id`, as a Prefect task."""
        task = _task_for(kind, sampler_id, self.retry)
        route = () if sampler_id is None else (sampler_id,)
        return task(self.connection, run_id, *route, seq_id, quote(payload))

    def run_operation(
        self, run_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict:
        """The page's `client.run_operation`: the operation's result."""
        return self.execute(run_id, kind, payload, seq_id=seq_id).result or {}

    def sampler_operation(
        self, run_id: str, sampler_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict:
        """The page's `client.sampler_operation`: the operation's result."""
        operation = self.execute(run_id, kind, payload, seq_id=seq_id, sampler_id=sampler_id)
        return operation.result or {}

    def submit(
        self, run_id: str, kind: str, payload: dict, *, sampler_id: str | None = None
    ) -> PrefectFuture[wire.Operation]:
        """Submit one operation as a task future on the ledger's next id, allocated now:
        calls made one after another get consecutive ids, whatever order they finish in.
        The caller waits for the future and records the operation in the log."""
        task = _task_for(kind, sampler_id, self.retry)
        seq = self.ledger.next(run_id)
        route = () if sampler_id is None else (sampler_id,)
        return task.submit(self.connection, run_id, *route, seq, quote(payload))

    def fan_out(
        self, run_id: str, sampler_id: str, kind: str, payloads: Sequence[dict]
    ) -> list[wire.Operation]:
        """Submit sampler operations together on a reserved block of ids; wait for all.

        The server executes them in seq order, so the results equal sequential calls.
        """
        task = _task_for(kind, sampler_id, self.retry)
        seq_ids = self.ledger.reserve(run_id, len(payloads))
        with self.log.timing(kind):
            futures = [
                task.submit(self.connection, run_id, sampler_id, seq, quote(payload))
                for seq, payload in zip(seq_ids, payloads, strict=True)
            ]
            wait(futures)
            operations = [future.result() for future in futures]
        for operation in operations:
            self.log.record(operation)
        return operations
