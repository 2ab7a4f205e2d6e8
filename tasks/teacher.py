"""A retried distillation keeps the teacher an earlier attempt trained; the SFT teacher's
tokens count toward the distillation's budget.

With `teacher_sft`, a distillation's first step is an SFT subflow; its session bears the label
`prefect.parent-flow-run-id=<the distillation's flow run id>`
(flows.core.orchestration.cleanup.session_labels).
A retried attempt (the UI's Retry, `prefect flow-run retry`, flow `retries`) looks for such a
session whose run finished: the teacher was trained to the end and its final `save_state`
succeeded. It then distills from that checkpoint instead of training the teacher again, which
costs the same tokens and gives the same weights (the SFT flow is deterministic).

Either way the SFT run's billed usage, read from its journal, is part of the distillation
flow run's usage: its budget counts it before the first distillation cycle.
"""

from __future__ import annotations

from uuid import UUID

from prefect import get_run_logger, task

from blocks.connection import WhitneyConnection, client_for
from tasks.checkpoints import saved_checkpoints
from tasks.names import PARENT_FLOW_RUN_LABEL
from tasks.operations import TASK_DEFAULTS
from whitney import wire
from whitney.client import WhitneyClient
from whitney.uris import checkpoint_run_id


def final_checkpoint(client: WhitneyClient, run_id: str) -> str | None:
    """The checkpoint of the run's last succeeded save_state, if any."""
    checkpoints = saved_checkpoints(client, run_id)
    return checkpoints[-1] if checkpoints else None


def trained_teacher(client: WhitneyClient, flow_run_id: UUID | str) -> str | None:
    """The final checkpoint of a finished SFT run that an earlier attempt of the distillation
    flow run trained, if there is one."""
    for session in client.list_sessions(label=f"{PARENT_FLOW_RUN_LABEL}:{flow_run_id}"):
        for run_id in client.get_session(session.session_id).run_ids or []:
            if client.get_run(run_id).status == "finished":
                checkpoint = final_checkpoint(client, run_id)
                if checkpoint is not None:
                    return checkpoint
    return None


@task(name="find_trained_teacher", **TASK_DEFAULTS)
def find_trained_teacher(connection: WhitneyConnection, flow_run_id: UUID) -> str | None:
    """The teacher checkpoint an earlier attempt of this distillation trained, if any."""
    checkpoint = trained_teacher(client_for(connection), flow_run_id)
    if checkpoint is not None:
        get_run_logger().info("An earlier attempt trained the teacher: %s", checkpoint)
    return checkpoint


@task(name="read_teacher_sft_journal", **TASK_DEFAULTS)
def read_teacher_sft_journal(
    connection: WhitneyConnection, checkpoint: str
) -> list[wire.Operation]:
    """The journal of the SFT run that saved the teacher `checkpoint` (its billed usage)."""
    return list(client_for(connection).iter_journal(checkpoint_run_id(checkpoint)))
