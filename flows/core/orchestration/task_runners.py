"""The task runner a cycle's fan-outs run on: Prefect's thread pool (the default), or Dask
through prefect-dask's `DaskTaskRunner` (the optional `dask` extra), across processes.

    with cycle_task_runners(settings) as runner_for_cycle:
        cycle_flow = cycle.with_options(task_runner=runner_for_cycle())

A flow run starts (at most) one Dask cluster and every cycle subflow connects to it by its
scheduler address: starting a `LocalCluster` per cycle would cost seconds each time. With
`dask_address`, the subflows connect to an existing scheduler instead (a cluster of your
own). The choice changes where the tasks' HTTP calls are made, never what is sent: the seq
ids are allocated by the cycle before it submits, so results are identical either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from flows.core.orchestration.task_runner_settings import TaskRunnerSettings, check_task_runner


@contextmanager
def cycle_task_runners(settings: TaskRunnerSettings) -> Iterator[Callable[[], Any]]:
    """A factory of task runners for the cycle subflows of one flow run; a Dask local
    cluster (when asked for) lives as long as the block."""
    check_task_runner(settings)
    if settings.task_runner == "thread":
        from prefect.task_runners import ThreadPoolTaskRunner

        yield ThreadPoolTaskRunner
        return
    from prefect_dask import DaskTaskRunner

    with ExitStack() as stack:
        stack.enter_context(api_url_for_workers())
        if settings.dask_address:
            address = settings.dask_address
        else:
            from distributed import LocalCluster

            cluster = stack.enter_context(
                LocalCluster(
                    n_workers=settings.dask_workers,
                    threads_per_worker=settings.dask_threads_per_worker,
                    processes=True,
                    dashboard_address=None,
                    worker_dashboard_address=None,
                )
            )
            address = cluster.scheduler_address
        yield lambda: DaskTaskRunner(address=address)


@contextmanager
def api_url_for_workers() -> Iterator[None]:
    """Within a flow run on Prefect's ephemeral API (no PREFECT_API_URL), set the URL of the
    ephemeral server this process started: task runs in Dask worker processes get the flow's
    settings, and without a URL each would try to start an ephemeral server of its own."""
    from prefect.context import FlowRunContext
    from prefect.settings import PREFECT_API_URL, temporary_settings

    context = FlowRunContext.get()
    if PREFECT_API_URL.value() or context is None or context.client is None:
        yield
        return
    url = str(context.client.api_url).rstrip("/")
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield
