"""The Prefect task of a multi-turn environment that does I/O: one `initial_observation` or
`step` call (flows.core.environments.multiturn), named `env_start[episode=G.M]` or
`env_step[episode=G.M, turn=T]` in the UI.

The call runs in a worker thread that the task awaits, so Prefect's `timeout_seconds` ends
the wait (a sync task in Prefect's thread pool is only marked timed out once it returns); the
abandoned thread finishes on its own. Any exception, a timeout included, is retried: the same
call again. Like the operation tasks, it records nothing: no cache key, no persisted result.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from prefect import Task, task
from prefect.cache_policies import NONE


@task(name="environment", task_run_name="{name}", cache_policy=NONE, persist_result=False)
async def environment_call(name: str, call: Callable[[], Any]) -> Any:
    """Run `call` (an environment's method with its arguments bound) in a worker thread."""
    return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)


@functools.cache
def environment_task(retries: int, retry_delay_s: float, timeout_s: float) -> Task[..., Any]:
    """`environment_call` with these retries and this timeout (one copy per setting)."""
    return environment_call.with_options(
        retries=retries, retry_delay_seconds=retry_delay_s, timeout_seconds=timeout_s
    )
