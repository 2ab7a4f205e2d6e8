"""The one way a flow reaches Whitney: a task (`tasks.operations`, `tasks.lifecycle`, ...) run
on the flow's connection with the flow's retry policy (`TaskRetrySettings`, below).

    whitney = WhitneyCalls(connection, config.task_retry)
    session = whitney.run(open_session, labels, idempotency_key)
    future = whitney.submit(sample, run_id, sampler_id, seq_id, payload)

Ordered operations go through `tasks.sequenced_client.SequencedClient`, which picks
their seq ids and makes its calls through a `WhitneyCalls` too.

The retry policy of every Whitney task: only retryable WhitneyErrors, exponential backoff
with jitter, counts and delays from `TaskRetrySettings`.

A retried task resends the same seq_id, so the server answers with the stored operation
instead of running it again: retrying is always safe, never double-applies.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from blocks.connection import WhitneyConnection
from whitney.errors import WhitneyError

if TYPE_CHECKING:
    from prefect import Task
    from prefect.client.schemas.objects import TaskRun
    from prefect.futures import PrefectFuture
    from prefect.states import State


class TaskRetrySettings(BaseModel):
    """How often and how patiently a Whitney task is retried (on top of the client's own
    HTTP retries)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    retries: int = Field(default=3, ge=0, le=20, description="Retries of a Whitney task")
    delay_s: float = Field(
        default=1.0, ge=0, le=600, description="Delay before the first retry; doubles per retry"
    )
    max_delay_s: float = Field(default=30.0, ge=0, le=3600, description="Cap of one retry delay")
    jitter: float = Field(
        default=0.5, ge=0, le=10, description="Prefect retry_jitter_factor: random extra delay"
    )

    def delays(self) -> list[float]:
        """Exponential backoff: delay_s, 2*delay_s, 4*delay_s, ... capped at max_delay_s."""
        return [min(self.delay_s * 2**attempt, self.max_delay_s) for attempt in range(self.retries)]

    def task_options(self) -> dict[str, Any]:
        """The keyword arguments of `@task` / `Task.with_options` for this policy."""
        return {
            "retries": self.retries,
            "retry_delay_seconds": self.delays(),
            "retry_jitter_factor": self.jitter,
            "retry_condition_fn": retry_if_retryable,
        }


def retry_if_retryable(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Prefect's `retry_condition_fn`: retry only a WhitneyError that says it is retryable."""
    try:
        state.result()
    except WhitneyError as error:
        return error.retryable
    except Exception:
        return False
    return False


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
