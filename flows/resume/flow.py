"""`resume_run`: continue a training flow run that ended badly, for the `resume-run`
deployment, whose trigger starts it for every Crashed or Failed flow run of the training
deployments (deployments/prefect.yaml).

It reads the ended flow run from the Prefect API and decides (flows.resume.continuation):

- resumable: it Crashed (its process died: SIGKILL, OOM, a lost machine or worker), or
  Failed on an infrastructure error (the Prefect API or Whitney away after the retries);
  not: it failed on its own input (a ConfigError, a refused request, its environment's
  exception), it was cancelled, it is a subflow or was not deployed;
- from where: the latest trusted `cycle-{n}` checkpoint its attempts saved (tasks.resume),
  else the checkpoint it had itself resumed from, else the start (a run that saved none);
  a checkpoint after its last cycle means the training was over: nothing to resume;
- how often: a run continuing after the same cycle as its parent did is attempt k+1; past
  `max_attempts` it stops, with the reason.

First it marks Crashed the ended run's subflow runs left open (the cycle its process died
in). Then it releases what the ended run still holds on Whitney (its session, if no hook did),
creates a flow run of the same deployment with the same parameters and `config.resume_from`
set, tagged with its lineage, and emits `whitney.run.resumed` (or `whitney.run.not-resumed`,
with the reason). Seeds derive from (seed, cycle, prompt) and the checkpoint holds the
optimizer state, so the new run ends with the adapter an undisturbed run would have had.
Its markdown artifact `resume-<flow run id>` records the decision.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect import flow, get_client, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.events import emit_event

from blocks.endpoint import resolve_connection
from flows.core.orchestration.orchestrator import crash_open_subflows
from flows.core.records.events import RUN_NOT_RESUMED, RUN_RESUMED, flow_run_resource
from flows.core.records.run_records import artifact_key
from flows.resume.continuation import (
    Continuation,
    lineage_from_tags,
    next_attempt,
    resume_reason,
    without_lineage,
)
from tasks.names import checkpoint_cycle
from tasks.release import release_sessions
from tasks.resume import latest_checkpoints
from whitney.client import WhitneyClient

RELEASE_TIMEOUT_S = 60.0


def flow_run_id_of(reference: str) -> UUID:
    """A flow run id from itself or from its event resource id (`prefect.flow-run.<id>`)."""
    return UUID(reference.removeprefix("prefect.flow-run."))


def resume_checkpoint(client: WhitneyClient, ended: FlowRun) -> str | None:
    """The checkpoint to continue `ended` from: its latest trusted cycle checkpoint, else the
    one it resumed from itself, else None (from the start)."""
    found = latest_checkpoints(client, ended.id)
    if found is not None and found.checkpoint is not None:
        return found.checkpoint
    config = ended.parameters.get("config") or {}
    return config.get("resume_from") or None


def close_subflows(prefect: SyncPrefectClient, ended: FlowRun) -> None:
    """Mark Crashed the subflow runs (cycles) that `ended`, Crashed or Failed, left Running or
    Pending: its process died under them, so nothing else would end them."""
    state = ended.state
    if state is None or state.type not in (StateType.CRASHED, StateType.FAILED):
        return
    why = f"its flow run {ended.name} ({ended.id}) ended {state.type.value}"
    if crashed := crash_open_subflows(prefect, ended.id, why):
        get_run_logger().info("Marked Crashed with %s: %s", ended.name, ", ".join(crashed))


def refusal(ended: FlowRun, max_attempts: int) -> str | None:
    """Why `ended` is not resumed, before anything is read on Whitney (None: go on)."""
    state = ended.state
    kind = state.type.value if state is not None else "UNKNOWN"
    if ended.deployment_id is None or ended.parent_task_run_id is not None:
        return "not a deployed top-level flow run"
    if resume_reason(kind, state.message if state is not None else None) is None:
        message = state.message if state is not None else ""
        return f"it ended {kind}, not on an infrastructure error: {message}"
    if max_attempts < 1:
        return "max_attempts is 0: automatic resume is off"
    return None


def decision_key(ended_id: UUID) -> str:
    """The key of the artifact recording resume-run's decision about a flow run: its id, not
    its name (names repeat)."""
    return artifact_key("resume", str(ended_id))


def record(ended: FlowRun, verdict: str, rows: list[tuple[str, str]]) -> None:
    """The decision, as the resume-run flow run's markdown artifact."""
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    create_markdown_artifact(
        f"# Resume of {ended.name}\n\n{verdict}\n\n| | |\n| --- | --- |\n{table}\n",
        key=decision_key(ended.id),
        description=f"Automatic resume of flow run {ended.name} ({ended.id})",
    )


def not_resumed(ended: FlowRun, reason: str) -> dict[str, Any]:
    """Log, record and announce that `ended` is not resumed, and why."""
    get_run_logger().warning("Flow run %s (%s) is not resumed: %s", ended.name, ended.id, reason)
    record(ended, f"Not resumed: {reason}", [("flow run", str(ended.id))])
    emit_event(
        RUN_NOT_RESUMED,
        resource=flow_run_resource(ended.id),
        payload={"flow_run_id": str(ended.id), "reason": reason},
    )
    return {"resumed": False, "reason": reason}


@flow(name="resume-run", persist_result=False)
def resume_run(
    flow_run_id: str,
    max_attempts: int = 3,
    whitney_block: str | None = None,
) -> dict[str, Any]:
    """Continue the training flow run `flow_run_id` (or `prefect.flow-run.<id>`) from its
    latest checkpoint on a new flow run of its deployment, if it crashed or failed on an
    infrastructure error, at most `max_attempts` times in a row after the same cycle.

    Args:
        flow_run_id: The ended flow run (the trigger passes its event's resource id).
        max_attempts: How many runs in a row may continue after the same cycle (0: none).
        whitney_block: The WhitneyCredentials block of its Whitney; empty: the one its own
            parameters name.
    """
    logger = get_run_logger()
    with get_client(sync_client=True) as prefect:
        ended = prefect.read_flow_run(flow_run_id_of(flow_run_id))
        close_subflows(prefect, ended)
        if (reason := refusal(ended, max_attempts)) is not None:
            return not_resumed(ended, reason)
        config = dict(ended.parameters.get("config") or {})
        block = whitney_block or ended.parameters.get("whitney_block")
        with resolve_connection(config.get("api_url"), block).get_client() as client:
            release_sessions(client, ended.id, RELEASE_TIMEOUT_S, logger)
            checkpoint = resume_checkpoint(client, ended)
        after_cycle = checkpoint_cycle(checkpoint) if checkpoint is not None else -1
        cycles = int(config.get("cycles") or 0)
        if cycles and after_cycle + 1 >= cycles:
            over = f"its training was over: {checkpoint} is after its last cycle"
            return not_resumed(ended, over)
        state = ended.state
        why = resume_reason(state.type.value, state.message) if state is not None else None
        parent = lineage_from_tags(ended.tags)
        attempt = next_attempt(parent, after_cycle)
        if attempt > max_attempts:
            return not_resumed(
                ended,
                f"gave up after {max_attempts} runs in a row stopped after cycle {after_cycle} "
                f"(this one: {why}; {state.message if state is not None else ''})",
            )
        lineage = Continuation(str(ended.id), after_cycle, why or "", attempt)
        continued = prefect.create_flow_run_from_deployment(
            ended.deployment_id,
            parameters={**ended.parameters, "config": {**config, "resume_from": checkpoint}},
            tags=[*without_lineage(ended.tags), *lineage.tags()],
            idempotency_key=f"whitney-resume-{ended.id}",
            job_variables=ended.job_variables,
        )
    logger.info(
        "Flow run %s (%s, %s) continues as %s (%s) from %s, attempt %d of %d",
        ended.name,
        ended.id,
        why,
        continued.name,
        continued.id,
        checkpoint or "the start",
        attempt,
        max_attempts,
    )
    record(
        ended,
        f"Resumed as flow run {continued.name} ({continued.id}).",
        [(name, str(value)) for name, value in lineage.as_dict().items()]
        + [("checkpoint", checkpoint or "(the start)"), ("new flow run", str(continued.id))],
    )
    emit_event(
        RUN_RESUMED,
        resource=flow_run_resource(ended.id),
        related=[
            {
                "prefect.resource.id": f"prefect.flow-run.{continued.id}",
                "prefect.resource.role": "resumed-by",
            }
        ],
        payload={
            **lineage.as_dict(),
            "checkpoint": checkpoint,
            "flow_run_id": str(continued.id),
        },
    )
    return {"resumed": True, "flow_run_id": str(continued.id), **lineage.as_dict()}
