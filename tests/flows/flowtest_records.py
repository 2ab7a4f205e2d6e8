"""Everything Prefect holds of one flow run: the run and its subflow runs at every depth, their
task runs, logs and artifacts, each read page after page with a filter on those flow runs (the
session's Prefect database is shared, and a read is capped at a page), polled until a
condition holds (logs and task runs arrive asynchronously)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from prefect import get_client
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import Artifact, FlowRun, Log, TaskRun
from prefect.client.schemas.sorting import ArtifactSort, FlowRunSort, LogSort, TaskRunSort
from prefect.logging.handlers import APILogWorker

from flows.core.orchestration.paging import every_page


@dataclass(frozen=True)
class FlowRunRecords:
    """A flow run's records: its flow runs (itself first), task runs, logs and artifacts."""

    flow_runs: list[FlowRun]
    task_runs: list[TaskRun]
    logs: list[Log]
    artifacts: list[Artifact]

    def log_messages(self) -> list[str]:
        return [log.message for log in self.logs]


def family(prefect: SyncPrefectClient, flow_run_id: UUID) -> list[FlowRun]:
    """The flow run and its subflow runs, at every depth."""
    runs, parents = [prefect.read_flow_run(flow_run_id)], [flow_run_id]
    while parents:
        children = FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=parents))
        found = every_page(
            lambda offset, f=children: prefect.read_flow_runs(
                flow_run_filter=f, sort=FlowRunSort.ID_DESC, offset=offset
            )
        )
        runs += found
        parents = [run.id for run in found]
    return runs


def read_records(flow_run_id: UUID) -> FlowRunRecords:
    """What Prefect holds of the flow run now."""
    with get_client(sync_client=True) as prefect:
        flow_runs = family(prefect, flow_run_id)
        ids = [run.id for run in flow_runs]
        task_runs = every_page(
            lambda offset: prefect.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)),
                sort=TaskRunSort.ID_DESC,
                offset=offset,
            )
        )
        logs = every_page(
            lambda offset: prefect.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)),
                sort=LogSort.TIMESTAMP_ASC,
                offset=offset,
            )
        )
        artifacts = every_page(
            lambda offset: prefect.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=ids)),
                sort=ArtifactSort.ID_DESC,
                offset=offset,
            )
        )
    return FlowRunRecords(flow_runs, task_runs, logs, artifacts)


def records_once(
    flow_run_id: UUID, ready: Callable[[FlowRunRecords], bool], timeout_s: float = 60.0
) -> FlowRunRecords:
    """The flow run's records, once `ready` holds of them (this process's logs sent first,
    then polled; fails past `timeout_s`)."""
    APILogWorker.drain_all()
    deadline = time.monotonic() + timeout_s
    while not ready(records := read_records(flow_run_id)):
        assert time.monotonic() < deadline, "the flow run's records never got ready"
        time.sleep(0.2)
    return records
