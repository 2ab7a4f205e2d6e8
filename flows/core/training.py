"""The start and the normal end of a training flow run on Whitney, shared by the flows.

    start_training_run    resume point (flows.core.resume), open_session labelled with the flow
                          run id, create_run (from the resume checkpoint, if any)
    save_final_state      save_state (named: a resume point too)
    export_adapter        export_lora
    release_training_run  finish_run (the trained run, then any other), close_session
    end_training_run      the three above, for a flow with one run

All are made of retried tasks with idempotency keys per flow run attempt, so a retried task
never opens a second session or run. A bad ending is the cleanup hooks' business
(flows.core.cleanup), found through the session label.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prefect.context import FlowRunContext

from flows.core.adapter import AdapterExport
from flows.core.cleanup import session_labels
from flows.core.config import FlowConfig
from flows.core.operation_client import OperationClient
from flows.core.operation_log import OperationLog
from flows.core.resume import ResumePoint, find_resume_point
from flows.core.sequenced_client import SequencedClient
from flows.core.sequencing import SeqLedger
from tasks.connection import WhitneyConnection
from tasks.lifecycle import close_session, create_run, finish_run, open_session
from tasks.retry import with_retry


@dataclass(frozen=True)
class TrainingRun:
    """A flow run attempt's Whitney session and trainable run, and where it starts."""

    connection: WhitneyConnection
    session_id: str
    run_id: str
    next_seq_id: int
    start: ResumePoint
    attempt: str
    """The flow run attempt's prefix of idempotency keys, for any further run it creates."""


@dataclass(frozen=True)
class FinalState:
    """What the normal end leaves: the checkpoint URI and the exported adapter."""

    checkpoint: str
    adapter: AdapterExport


def start_training_run(
    config: FlowConfig,
    connection: WhitneyConnection,
    name: str = "policy",
    labels: dict[str, str] | None = None,
) -> TrainingRun:
    """Inside a flow run: find its resume point, open its labelled session and create its
    trainable run (from the checkpoint it resumes from, if any), keyed `name`, with `labels`."""
    flow_run = FlowRunContext.get().flow_run
    attempt = f"prefect-{flow_run.id}-{flow_run.run_count}"
    start = with_retry(find_resume_point, config.task_retry)(
        connection, flow_run.id, flow_run.run_count, config.resume_from, config.cleanup_timeout_s
    )
    session = with_retry(open_session, config.task_retry)(
        connection, session_labels(flow_run), f"{attempt}-session"
    )
    run = with_retry(create_run, config.task_retry)(
        connection,
        session.session_id,
        config.provider,
        config.base_model,
        lora_rank=config.lora_rank,
        seed=config.seed,
        idempotency_key=f"{attempt}-{name}",
        from_checkpoint=start.checkpoint,
        labels=labels,
    )
    return TrainingRun(connection, session.session_id, run.run_id, run.next_seq_id, start, attempt)


def save_final_state(client: OperationClient, run_id: str, checkpoint_name: str | None) -> str:
    """save_state named `checkpoint_name` (unnamed if None); the checkpoint URI."""
    state = {"name": checkpoint_name} if checkpoint_name is not None else {}
    return client.run_operation(run_id, "save_state", state)["checkpoint"]


def export_adapter(client: OperationClient, run_id: str) -> AdapterExport:
    """export_lora: the run's adapter artifact."""
    return AdapterExport.model_validate(client.run_operation(run_id, "export_lora", {}))


def release_training_run(
    training: TrainingRun, config: FlowConfig, other_run_ids: Iterable[str] = ()
) -> None:
    """Finish the trained run, then `other_run_ids` (a critic, a teacher), and close the
    session."""
    finish = with_retry(finish_run, config.task_retry)
    for run_id in (training.run_id, *other_run_ids):
        finish(training.connection, run_id)
    with_retry(close_session, config.task_retry)(training.connection, training.session_id)


def end_training_run(
    training: TrainingRun, config: FlowConfig, seq: int, checkpoint_name: str
) -> FinalState:
    """The page's normal end from seq id `seq`: save_state named `checkpoint_name`,
    export_lora, finish the run, close the session."""
    client = SequencedClient(
        training.connection, SeqLedger({training.run_id: seq}), config.task_retry, OperationLog()
    )
    checkpoint = save_final_state(client, training.run_id, checkpoint_name)
    adapter = export_adapter(client, training.run_id)
    release_training_run(training, config)
    return FinalState(checkpoint, adapter)
