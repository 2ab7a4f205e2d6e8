"""`resume_sweep`: the automatic resume's backstop, for the `resume-sweep-every-5-minutes`
deployment (deployments/prefect.yaml).

The resume-run trigger acts on a flow run's Crashed or Failed state event. A Prefect server
that loses that event (SQLite locked under load, a restart at the wrong moment) leaves the run
ended with nobody deciding about it. On its schedule this finds the training deployments'
top-level flow runs that ended Crashed or Failed within `within_hours`, at least
`settle_seconds` ago (the trigger's turn first), on which no resume-run has decided (no
`resume-<flow run id>` artifact), and runs `resume_run` on each as a subflow: the decision,
record and event the trigger would have given. A run decided twice (the trigger late, the
sweep too) continues once: the continuation's idempotency key is the ended run's id. The
window is filtered on the server (state type, end time, deployment) and every page of runs and
of decisions is read, however many old failures a busy server holds.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import flow, get_client, get_run_logger
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import (
    ArtifactCollectionFilter,
    ArtifactCollectionFilterKey,
    DeploymentFilter,
    DeploymentFilterName,
    FlowRunFilter,
    FlowRunFilterEndTime,
    FlowRunFilterParentTaskRunId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import ArtifactCollectionSort, FlowRunSort

from flows.catalogue import DEPLOYMENTS
from flows.core.orchestration.paging import every_page
from flows.resume.flow import decision_key, resume_run


def ended_badly(
    prefect: SyncPrefectClient, deployments: tuple[str, ...], since: datetime, until: datetime
) -> list[FlowRun]:
    """The deployments' top-level flow runs that ended Crashed or Failed in the window, newest
    first: filtered on the server, every page read."""
    runs = every_page(
        lambda offset: prefect.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.CRASHED, StateType.FAILED])
                ),
                end_time=FlowRunFilterEndTime(after_=since, before_=until),
                parent_task_run_id=FlowRunFilterParentTaskRunId(is_null_=True),
            ),
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=list(deployments))),
            sort=FlowRunSort.END_TIME_DESC,
            offset=offset,
        )
    )
    return list({run.id: run for run in runs}.values())  # a run ending meanwhile shifts a page


def undecided(prefect: SyncPrefectClient, runs: list[FlowRun]) -> list[FlowRun]:
    """The runs no resume-run has recorded a decision about."""
    if not runs:
        return []
    keys = {decision_key(run.id): run for run in runs}
    decided = every_page(
        lambda offset: prefect.read_latest_artifacts(
            artifact_filter=ArtifactCollectionFilter(
                key=ArtifactCollectionFilterKey(any_=list(keys))
            ),
            sort=ArtifactCollectionSort.KEY_ASC,
            offset=offset,
        )
    )
    seen = {artifact.key for artifact in decided}
    return [run for key, run in keys.items() if key not in seen]


@flow(name="resume-sweep", persist_result=False)
def resume_sweep(
    deployments: tuple[str, ...] = DEPLOYMENTS,
    within_hours: float = 24.0,
    settle_seconds: float = 120.0,
    max_attempts: int = 3,
    whitney_block: str | None = None,
) -> dict[str, Any]:
    """Decide about every training flow run that ended Crashed or Failed with no resume-run
    decision yet, as the resume-run trigger would have; the decisions by flow run id.

    Args:
        deployments: The training deployments whose runs are swept.
        within_hours: How far back an ended run is still swept.
        settle_seconds: How long a run has been ended before the sweep takes it (the
            trigger's resume-run first).
        max_attempts: As resume-run's.
        whitney_block: As resume-run's; empty: the one each run's parameters name.
    """
    now = datetime.now(UTC)
    with get_client(sync_client=True) as prefect:
        window = ended_badly(
            prefect,
            deployments,
            now - timedelta(hours=within_hours),
            now - timedelta(seconds=settle_seconds),
        )
        pending = undecided(prefect, window)
    logger = get_run_logger()
    logger.info(
        "%d flow run(s) of %s ended Crashed or Failed in the window, %d with no decision%s",
        len(window),
        ", ".join(deployments),
        len(pending),
        "".join(f"\n  {run.name} ({run.id})" for run in pending),
    )
    decisions: dict[str, Any] = {}
    failed: list[str] = []
    for run in pending:
        state = resume_run.with_options(flow_run_name=f"resume-{run.name}")(
            str(run.id), max_attempts=max_attempts, whitney_block=whitney_block, return_state=True
        )
        if state.is_completed():
            decisions[str(run.id)] = state.result()
        else:
            failed.append(f"{run.name} ({run.id}): {state.message}")
    if failed:
        raise RuntimeError("resume-run failed for " + "; ".join(failed))
    return {"swept": len(window), "decided": decisions}
