"""Release what a flow run holds on Whitney: cancel the runs of its labelled sessions, wait
until each is terminal (bounded), close the sessions. Used by the cleanup hooks and by a
retried attempt before it starts."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from tasks.names import FLOW_RUN_LABEL
from whitney import wire
from whitney.client import WhitneyClient
from whitney.errors import WhitneyError


def cancel_and_await(client: WhitneyClient, run_id: str, timeout_s: float, logger: Any) -> None:
    """Cancel the run unless it is terminal, and poll until it is (bounded)."""
    run = client.get_run(run_id)
    if run.status in wire.RUN_TERMINAL:
        logger.info("Whitney run %s is already %s", run_id, run.status)
        return
    client.cancel(run_id)
    run = client.wait_terminal(run_id, timeout=timeout_s)
    logger.info("Cancelled Whitney run %s: now %s", run_id, run.status)


def release_sessions(
    client: WhitneyClient, flow_run_id: UUID | str, timeout_s: float, logger: Any
) -> int:
    """Cancel the runs of the flow run's open sessions and close them; how many were open."""
    label = f"{FLOW_RUN_LABEL}:{flow_run_id}"
    released = 0
    for session in client.list_sessions(label=label):
        if session.status == "closed":
            continue
        for run_id in client.get_session(session.session_id).run_ids or []:
            try:
                cancel_and_await(client, run_id, timeout_s, logger)
            except WhitneyError as error:
                logger.warning("Could not cancel Whitney run %s: %s", run_id, error)
        client.close_session(session.session_id)
        logger.info("Closed Whitney session %s", session.session_id)
        released += 1
    if not released:
        logger.info("No open Whitney session bears %s", label)
    return released
