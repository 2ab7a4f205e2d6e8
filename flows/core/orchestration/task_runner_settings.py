"""Where a cycle's fanned-out tasks run: the settings and their check (no Prefect)."""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from flows.core.config import ConfigError

TaskRunnerName = Literal["thread", "dask"]


DASK_EXTRA_HINT = "pip install 'whitney-flows[dask]'"


class TaskRunnerSettings(BaseModel):
    """Where a cycle's fanned-out tasks run."""

    model_config = ConfigDict(extra="forbid")

    task_runner: TaskRunnerName = Field(
        default="thread",
        description="thread: Prefect's thread pool in the flow's process; dask: prefect-dask's "
        f"DaskTaskRunner on a local cluster of worker processes (the dask extra: "
        f"{DASK_EXTRA_HINT})",
    )
    dask_address: str | None = Field(
        default=None,
        description="dask only: the address of an existing Dask scheduler (tcp://host:port); "
        "empty: a local cluster for the flow run",
    )
    dask_workers: int = Field(
        default=2, ge=1, le=256, description="dask only: worker processes of the local cluster"
    )
    dask_threads_per_worker: int = Field(
        default=4, ge=1, le=256, description="dask only: threads per worker process"
    )


def check_task_runner(settings: TaskRunnerSettings) -> None:
    """ConfigError when the Dask runner is asked for but prefect-dask is not installed."""
    if settings.task_runner == "dask" and importlib.util.find_spec("prefect_dask") is None:
        raise ConfigError(
            "task_runner", f"dask needs prefect-dask, which is not installed: {DASK_EXTRA_HINT}"
        )
