"""The retry policy of every Whitney task: only retryable WhitneyErrors, exponential backoff
with jitter, counts and delays from `TaskRetrySettings` (a config's `task_retry`). No Prefect:
the configs hold it; the tasks take it (tasks.operations.WhitneyCalls).

A retried task resends the same seq_id, so the server answers with the stored operation
instead of running it again: retrying is always safe, never double-applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from whitney.errors import WhitneyError

if TYPE_CHECKING:
    from prefect import Task
    from prefect.client.schemas.objects import TaskRun
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
