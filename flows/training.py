"""The start and the normal end of a training flow run on Whitney, shared by the flows.

    start_training_run    resume point (flows.resume), open_session labelled with the flow
                          run id, create_run (from the resume checkpoint, if any)
    end_training_run      save_state (named: a resume point too), export_lora, finish_run,
                          close_session

Both are made of retried tasks with idempotency keys per flow run attempt, so a retried task
never opens a second session or run. A bad ending is the cleanup hooks' business
(flows.cleanup), found through the session label.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect.context import FlowRunContext

from flows.cleanup import session_labels
from flows.config import FlowConfig
from flows.context import SequencedClient
from flows.metrics import AdapterExport
from flows.operation_log import OperationLog
from flows.resume import ResumePoint, find_resume_point
from flows.sequencing import SeqLedger
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


@dataclass(frozen=True)
class FinalState:
    """What the normal end leaves: the checkpoint URI and the exported adapter."""

    checkpoint: str
    adapter: AdapterExport


def start_training_run(config: FlowConfig, connection: WhitneyConnection) -> TrainingRun:
    """Inside a flow run: find its resume point, open its labelled session and create its
    policy run (from the checkpoint it resumes from, if any)."""
    flow_run = FlowRunContext.get().flow_run
    attempt = f"prefect-{flow_run.id}-{flow_run.run_count}"
    start = with_retry(find_resume_point, config.task_retry)(
        connection, flow_run.id, flow_run.run_count, config.resume_from, config.cleanup_timeout_s
    )
    session = with_retry(open_session, config.task_retry)(
        connection, session_labels(flow_run.id), f"{attempt}-session"
    )
    run = with_retry(create_run, config.task_retry)(
        connection,
        session.session_id,
        config.provider,
        config.base_model,
        lora_rank=config.lora_rank,
        seed=config.seed,
        idempotency_key=f"{attempt}-policy",
        from_checkpoint=start.checkpoint,
    )
    return TrainingRun(connection, session.session_id, run.run_id, run.next_seq_id, start)


def end_training_run(
    training: TrainingRun, config: FlowConfig, seq: int, checkpoint_name: str
) -> FinalState:
    """The page's normal end from seq id `seq`: save_state named `checkpoint_name`,
    export_lora, finish the run, close the session."""
    client = SequencedClient(
        training.connection, SeqLedger({training.run_id: seq}), config.task_retry, OperationLog()
    )
    run_id = training.run_id
    checkpoint = client.run_operation(run_id, "save_state", {"name": checkpoint_name})
    adapter = client.run_operation(run_id, "export_lora", {})
    with_retry(finish_run, config.task_retry)(training.connection, run_id)
    with_retry(close_session, config.task_retry)(training.connection, training.session_id)
    return FinalState(checkpoint["checkpoint"], AdapterExport.model_validate(adapter))
