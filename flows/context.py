"""The page's `ctx` for `build_loss(sample, cycle, request, ctx)`, and its `ctx.client`.

`ctx.client` looks like the page's client (`run_operation`, `sampler_operation`), but every
call is a retried Prefect task whose seq id comes from the cycle's `SeqLedger`: extra calls a
recipe makes take the next ids in order, so a replayed cycle makes them again with the same
ids. The cycle itself makes its calls through the same object.

Payloads go to the tasks `quote`d, so Prefect does not walk them looking for futures: for a
forward_backward payload of 64 datums that walk alone cost about 0.1 s per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prefect import Task
from prefect.futures import PrefectFuture, wait
from prefect.utilities.annotations import quote

from flows.operation_log import OperationLog
from flows.sequencing import SeqLedger
from tasks.connection import WhitneyConnection
from tasks.operations import RUN_OPERATION_TASKS, SAMPLER_OPERATION_TASKS
from tasks.retry import TaskRetrySettings, with_retry
from whitney import wire


class OperationClient(Protocol):
    """What `ctx.client` offers a recipe: the page's two ordered calls."""

    def run_operation(
        self, run_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict: ...

    def sampler_operation(
        self, run_id: str, sampler_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict: ...


class AuxiliaryRunRef(Protocol):
    """An auxiliary run as a recipe sees it in `ctx.runs` (a critic, a frozen reference)."""

    @property
    def run_id(self) -> str: ...

    @property
    def sampler_id(self) -> str | None: ...


@dataclass(frozen=True)
class LossContext:
    """The page's ctx (client, run_id, sampler_id, provider) for one group, plus the group's
    rewards and advantages and the configured loss_config.

    `runs` holds the auxiliary runs the recipe declared, by name; their calls go through
    `client` too (each run has its own seq ids in the cycle's ledger). `scratch` is one dict
    per cycle, shared by the cycle's build_loss calls and the recipe's finish_cycle (rebuilt
    when a cycle replays)."""

    client: OperationClient
    run_id: str
    sampler_id: str
    provider: str
    loss_config: Mapping[str, float]
    rewards: list[float]
    advantages: list[float]
    runs: Mapping[str, AuxiliaryRunRef] = field(default_factory=dict)
    scratch: dict[str, Any] = field(default_factory=dict)


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

    def reserve_seq_ids(self, run_id: str, count: int) -> range:
        """A block of the run's next ids, for calls a recipe submits together."""
        return self.ledger.reserve(run_id, count)

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
