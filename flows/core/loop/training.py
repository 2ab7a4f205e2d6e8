"""The start and the normal end of a training flow run on Whitney, shared by the flows.

    require_served        the provider's capabilities list the config's base models
    start_training_run    that check, resume point (tasks.resume), open_session labelled with
                          the flow run id, create_run (from the resume checkpoint, if any)
    TrainingRun.add_run   create_run of another run in the session (critic, reference, teacher)
    end_training_run      save_state (named: a resume point too), export_lora, finish_run
                          (the trained run, then any other), close_session; the adapter's
                          manifest (flows.core.records.manifest) and a fork's lineage artifact

A run started from `resume_from` is a fork (flows.core.records.lineage): its lineage is found before
anything is allocated, and `whitney.run.forked` is emitted once its run exists.

All are made of retried tasks with idempotency keys per flow run attempt, so a retried task
never opens a second session or run. A bad ending is the cleanup hooks' business
(flows.core.orchestration.cleanup), found through the session label.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefect.context import FlowRunContext
from pydantic import BaseModel, Field

from blocks.connection import WhitneyConnection
from blocks.endpoint import check_served
from flows.core.config import FlowConfig
from flows.core.orchestration.cleanup import session_labels
from flows.core.records.events import checkpoint_saved, run_finished, run_forked
from flows.core.records.lineage import Lineage, find_lineage, lineage_artifact
from flows.core.records.manifest import flow_manifest
from flows.core.records.run_records import artifact_key
from flows.core.records.summary_parts import flow_run_export_command
from tasks.lifecycle import capabilities, close_session, create_run, finish_run, open_session
from tasks.operations import SequencedClient, WhitneyCalls
from tasks.resume import ResumePoint, find_resume_point
from whitney import wire


@dataclass(frozen=True)
class TrainingRun:
    """A flow run attempt's Whitney session and trainable run, and where it starts."""

    config: FlowConfig
    connection: WhitneyConnection
    session_id: str
    run_id: str
    next_seq_id: int
    start: ResumePoint
    attempt: str
    """The flow run attempt's prefix of idempotency keys, for any further run it creates."""
    lineage: Lineage | None = None
    """Where a run started from another run's checkpoint came from (`resume_from`)."""

    @property
    def whitney(self) -> WhitneyCalls:
        """The flow's Whitney tasks, with its retry policy."""
        return WhitneyCalls(self.connection, self.config.task_retry)

    def client(self, starts: Mapping[str, int]) -> SequencedClient:
        """The flow's own ordered calls (outside the cycles), from the seq ids `starts`."""
        return SequencedClient(self.connection, starts, self.config.task_retry)

    def add_run(self, name: str, **options: Any) -> wire.Run:
        """Another run in the session (a critic, a reference, a teacher), keyed `name` for
        this attempt; `options` as for `create_run_in`."""
        return create_run_in(
            self.config, self.connection, self.session_id, f"{self.attempt}-{name}", **options
        )


def create_run_in(
    config: FlowConfig,
    connection: WhitneyConnection,
    session_id: str,
    idempotency_key: str,
    *,
    base_model: str | None = None,
    lora_rank: int | None = None,
    role: str = "policy",
    trainable: bool = True,
    from_checkpoint: str | None = None,
    labels: dict[str, str] | None = None,
) -> wire.Run:
    """create_run (retried) in the session, on the config's provider and seed, of the config's
    base model and LoRA rank unless `base_model` or `lora_rank` say otherwise."""
    return WhitneyCalls(connection, config.task_retry).run(
        create_run,
        session_id,
        config.provider,
        base_model or config.base_model,
        lora_rank=lora_rank or config.lora_rank,
        seed=config.seed,
        idempotency_key=idempotency_key,
        role=role,
        trainable=trainable,
        from_checkpoint=from_checkpoint,
        labels=labels,
    )


class TrainingResult(BaseModel):
    """What every training flow returns (its flow's result extends it): where the trained
    weights are."""

    session_id: str
    run_id: str = Field(description="The trained run")
    checkpoint: str = Field(description="The final save_state URI: the resume point")
    adapter: wire.ExportLoraResult
    resumed_from: str | None = Field(
        default=None, description="The checkpoint this flow run resumed from, if any"
    )
    lineage: Lineage | None = Field(
        default=None, description="Parent run, cycle and changes of a run forked (resume_from)"
    )
    manifest: dict[str, Any] = Field(
        default_factory=dict, description="What made the adapter (flows.core.records.manifest)"
    )


def require_served(config: FlowConfig, connection: WhitneyConnection) -> None:
    """ConfigError, before any session opens, naming the field of a base model the config's
    provider does not list in its capabilities (with the ones it does)."""
    check_served(config, WhitneyCalls(connection, config.task_retry).run(capabilities))


def start_training_run(
    config: FlowConfig,
    connection: WhitneyConnection,
    name: str = "policy",
    labels: dict[str, str] | None = None,
) -> TrainingRun:
    """Inside a flow run: check that the provider serves its base models, find its resume
    point, open its labelled session and create its trainable run (from the checkpoint it
    resumes from, if any), keyed `name`, with `labels`."""
    require_served(config, connection)
    lineage = find_lineage(connection, config)
    whitney = WhitneyCalls(connection, config.task_retry)
    flow_run = FlowRunContext.get().flow_run
    attempt = f"prefect-{flow_run.id}-{flow_run.run_count}"
    start = whitney.run(
        find_resume_point,
        flow_run.id,
        flow_run.run_count,
        config.resume_from,
        config.cleanup_timeout_s,
    )
    session = whitney.run(open_session, session_labels(flow_run), f"{attempt}-session")
    run = create_run_in(
        config,
        connection,
        session.session_id,
        f"{attempt}-{name}",
        from_checkpoint=start.checkpoint,
        labels=labels,
    )
    if lineage is not None:
        run_forked(run.run_id, lineage.model_dump(mode="json"))
    return TrainingRun(
        config, connection, session.session_id, run.run_id, run.next_seq_id, start, attempt, lineage
    )


def end_training_run(
    training: TrainingRun,
    client: SequencedClient,
    checkpoint_name: str | None,
    other_run_ids: Iterable[str] = (),
    cycles: Sequence[BaseModel] = (),
) -> TrainingResult:
    """The normal end, from where `client` stands: save_state named `checkpoint_name`
    (unnamed if None), export_lora, finish the trained run and then `other_run_ids` (a
    critic, a teacher), close the session; then the `whitney.checkpoint.saved` and
    `whitney.run.finished` events, the adapter's manifest (with the evaluations of `cycles`,
    the flow run's cycle metrics) and a fork's lineage artifact."""
    state = {"name": checkpoint_name} if checkpoint_name is not None else {}
    saved = client.execute(training.run_id, "save_state", state)
    exported = client.execute(training.run_id, "export_lora", {})
    for run_id in (training.run_id, *other_run_ids):
        training.whitney.run(finish_run, run_id)
    training.whitney.run(close_session, training.session_id)
    result = TrainingResult(
        session_id=training.session_id,
        run_id=training.run_id,
        checkpoint=saved.result_as(wire.SaveStateResult).checkpoint,
        adapter=exported.result_as(wire.ExportLoraResult),
        resumed_from=training.start.checkpoint,
        lineage=training.lineage,
    )
    result.manifest = flow_manifest(
        flow=FlowRunContext.get().flow.name,
        config=training.config.model_dump(mode="json"),
        run=result.model_dump(mode="json"),
        seq_ids=(training.next_seq_id, exported.seq_id),
        cycles=[cycle.model_dump(mode="json") for cycle in cycles],
        lineage=result.lineage.model_dump(mode="json") if result.lineage else None,
    )
    if training.lineage is not None:
        key = artifact_key("lineage", training.run_id)
        lineage_artifact(training.connection, training.lineage, training.run_id, key)
    checkpoint_saved(result.checkpoint, training.config.eval_settings())
    adapter = result.adapter
    command = flow_run_export_command(result.run_id)
    run_finished(result.run_id, result.checkpoint, adapter.sha256, adapter.artifact_id, command)
    return result
