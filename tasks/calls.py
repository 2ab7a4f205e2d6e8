"""The one way a flow reaches Whitney: a task (`tasks.operations`, `tasks.lifecycle`, ...) run
on the flow's connection with the flow's retry policy (`tasks.retry`).

    whitney = WhitneyCalls(connection, config.task_retry)
    session = whitney.run(open_session, labels, idempotency_key)
    future = whitney.submit(sample, run_id, sampler_id, seq_id, payload)

Ordered operations go through `tasks.sequenced_client.SequencedClient`, which picks
their seq ids and makes its calls through a `WhitneyCalls` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blocks.connection import WhitneyConnection
from tasks.retry import TaskRetrySettings, with_retry

if TYPE_CHECKING:
    from prefect import Task
    from prefect.futures import PrefectFuture


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
