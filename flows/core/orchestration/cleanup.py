"""The cleanup hook of every flow: nothing stays allocated (and billed) after a failure, a
crash or a cancellation.

It needs no in-memory state: it finds the Whitney sessions by the label the flows put on them
(`prefect.flow-run-id=<flow run id>`, of the failing flow run or of any flow run above it),
with a client built from the flow run's parameters and the environment, so it works in the
flow's process and in a runner or worker that runs `on_cancellation` after the flow process
was killed. It cancels every run that is not terminal, polls each until terminal (bounded),
closes the sessions, logs what it did, emits `whitney.run.released` (which also stops the
stall automations' clocks for the flow run), is idempotent, and never raises past Prefect.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from prefect import Flow, get_client
from prefect.client.schemas.objects import FlowRun
from prefect.logging.loggers import flow_run_logger
from prefect.states import State

from blocks.endpoint import resolve_connection
from flows.core.records.events import run_released
from flows.core.records.tracking.session import end_tracking
from tasks.names import FLOW_RUN_LABEL, PARENT_FLOW_RUN_LABEL
from tasks.release import release_sessions

DEFAULT_CLEANUP_TIMEOUT_S = 60.0
CLEANUP_RETRY_SECONDS = 20.0


def session_labels(flow_run: FlowRun) -> dict[str, str]:
    """The labels a flow puts on its sessions: its flow run id and, when it runs as a subflow
    (the SFT flow training a distillation teacher), its parent flow run's."""
    labels = {FLOW_RUN_LABEL: str(flow_run.id)}
    lineage = flow_run_lineage(flow_run)
    if len(lineage) > 1:
        labels[PARENT_FLOW_RUN_LABEL] = str(lineage[1])
    return labels


def flow_run_lineage(flow_run: FlowRun) -> list[UUID]:
    """`flow_run` and the flow runs above it, up to the top-level one (last), through the
    Prefect API. A training flow called as a subflow (the SFT flow training a distillation
    teacher) labels its sessions with its own id, so cleanup looks at every level."""
    lineage = [flow_run.id]
    if flow_run.parent_task_run_id is None:
        return lineage
    with get_client(sync_client=True) as prefect:
        current = flow_run
        while current.parent_task_run_id is not None:
            parent_task_run = prefect.read_task_run(current.parent_task_run_id)
            if parent_task_run.flow_run_id is None:
                break
            current = prefect.read_flow_run(parent_task_run.flow_run_id)
            lineage.append(current.id)
    return lineage


def release_whitney(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    """on_failure / on_crashed / on_cancellation: release the Whitney resources of the flow
    run's top-level flow run. Logs and swallows every error."""
    logger: logging.LoggerAdapter[logging.Logger] = flow_run_logger(flow_run, flow)
    try:
        config = flow_run.parameters.get("config") or {}
        timeout_s = float(config.get("cleanup_timeout_s") or DEFAULT_CLEANUP_TIMEOUT_S)
        block = flow_run.parameters.get("whitney_block")
        connection = resolve_connection(config.get("api_url"), block).model_copy(
            update={"max_retry_seconds": CLEANUP_RETRY_SECONDS}
        )
        owners = flow_run_lineage(flow_run)
        logger.info(
            "Flow run is %s: releasing Whitney resources of %s",
            state.name,
            ", ".join(str(owner) for owner in owners),
        )
        with connection.get_client() as client:
            released = sum(release_sessions(client, owner, timeout_s, logger) for owner in owners)
        run_released(owners[-1], flow_run.id, state.name or "", released)
    except Exception as error:
        logger.error("Whitney cleanup of flow run %s failed: %r", flow_run.id, error)


CLEANUP_HOOKS: dict[str, list[Any]] = {
    "on_completion": [end_tracking],
    "on_failure": [release_whitney, end_tracking],
    "on_crashed": [release_whitney, end_tracking],
    "on_cancellation": [release_whitney, end_tracking],
}
"""Keyword arguments for `@flow`: the same idempotent cleanup on every bad ending, and the
end of the flow run's tracked run on every ending (flows.core.records.tracking)."""
