"""The lineage key: what names a tracked run across the flow runs that train it.

A flow run starting from the base model is its own lineage: the key is its Prefect flow run
id, which its retries (the same flow run, `run_count` > 1) keep whatever checkpoint they resume
from. A flow run given `resume_from` continues the lineage of that checkpoint: its Whitney
run was created from an earlier checkpoint, or not; the first run of the chain was opened by
the flow run whose id its session's label holds (`prefect.flow-run-id`), and that id is the
key. All of it is read from Whitney's records: nothing is kept on this machine.
"""

from __future__ import annotations

from prefect.client.schemas.objects import FlowRun

from blocks.connection import WhitneyConnection
from tasks.names import CYCLE_CHECKPOINT, FLOW_RUN_LABEL
from whitney.client import WhitneyClient

MAX_HOPS = 10_000
"""A bound on the chain of resumed runs followed back (a chain is far shorter)."""


def checkpoint_run(checkpoint: str) -> str:
    """The Whitney run that saved a `whitney://runs/<run>/states/cycle-<n>` checkpoint."""
    match = CYCLE_CHECKPOINT.match(checkpoint)
    if match is None:
        raise ValueError(f"not a cycle checkpoint: {checkpoint!r}")
    return match["run_id"]


def first_run(client: WhitneyClient, run_id: str) -> str:
    """The run a chain of runs created from each other's checkpoints began with."""
    for _ in range(MAX_HOPS):
        source = (client.get_run(run_id).model_extra or {}).get("from_checkpoint")
        if not isinstance(source, str) or CYCLE_CHECKPOINT.match(source) is None:
            return run_id
        run_id = checkpoint_run(source)
    return run_id


def lineage_key(
    flow_run: FlowRun, resume_from: str | None, connection: WhitneyConnection | None
) -> str:
    """The tracked run's key for this flow run (see the module docstring)."""
    if not resume_from or connection is None:
        return str(flow_run.id)
    with connection.get_client() as client:
        first = first_run(client, checkpoint_run(resume_from))
        session = client.get_session(client.get_run(first).session_id)
    return session.labels.get(FLOW_RUN_LABEL) or first
