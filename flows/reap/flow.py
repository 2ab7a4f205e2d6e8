"""`reap_orphaned_sessions`: `whitney-flows reap` as a flow (flows.core.orchestration.reaping), for
the
`reap-every-15-minutes` deployment.

`apply` defaults to False, as the command does: a run started by hand lists what it would
close. The deployment sets it to True: a schedule that only lists closes nothing. Each run
logs what it closed and leaves the verdicts in a table artifact (`reap`).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from blocks.endpoint import resolve_connection
from flows.core.orchestration.reaping import reap, survey


@flow(name="reap", persist_result=False)
def reap_orphaned_sessions(
    apply: bool = False, whitney_block: str | None = None, api_url: str | None = None
) -> list[dict[str, Any]]:
    """Close the Whitney sessions whose Prefect flow run is Completed, Failed, Cancelled,
    Crashed or gone; keep the others. Returns the verdicts; fails if a session could not be
    closed.

    Args:
        apply: Close them (False: only list what would be closed).
        whitney_block: The WhitneyCredentials block of the Whitney to reap (the deployment
            sets it); empty: api_url or WHITNEY_API_URL, and the key in WHITNEY_API_KEY.
        api_url: The Whitney URL, without a block.
    """
    logger = get_run_logger()
    with resolve_connection(api_url, whitney_block).get_client() as client:
        verdicts = survey(client)
        if apply:
            verdicts = reap(client, verdicts, logger)
    rows = [verdict.as_dict() for verdict in verdicts]
    actions = [verdict.action for verdict in verdicts]
    logger.info(
        "%d sessions labelled with a flow run: %d kept, %d %s, %d failed",
        len(rows),
        actions.count("keep"),
        actions.count("closed" if apply else "close"),
        "closed" if apply else "to close (apply is off)",
        actions.count("failed"),
    )
    create_table_artifact(
        rows, key="reap", description="Whitney sessions labelled with a flow run, and the action"
    )
    if actions.count("failed"):
        raise RuntimeError(f"{actions.count('failed')} sessions could not be closed (see the logs)")
    return rows
