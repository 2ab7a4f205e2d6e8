"""Checkpoints evaluated on frozen runs, and the table comparing a run's checkpoints.

    read_run (each run that saved one)        its provider, base model and LoRA rank
    open_session (labelled)
    create_run x checkpoints                  trainable: false, from_checkpoint
    per frozen run: evaluate_weights          sampler `eval`, the eval set's requests
    finish_run x checkpoints, close_session

Everything is checked (the eval set loads, the data reads) before the session opens, and the
session is closed before the flow goes on: a promotion that then waits for a person holds no
Whitney run open. The same settings sample the same requests as a training flow's inline
evaluation, so a checkpoint's numbers here equal those of the cycle that saved it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prefect import get_client
from prefect.artifacts import create_table_artifact
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort
from prefect.context import FlowRunContext
from pydantic import BaseModel, Field

from blocks.connection import WhitneyConnection
from flows.checkpoints.config import EvaluateConfig
from flows.core.config import ConfigError
from flows.core.environments.rendering import load_renderer
from flows.core.evaluation.config import CORPUS, EvalSettings
from flows.core.evaluation.plan import EvalMetrics, EvalPlan, HeldOutPair, load_eval_plan
from flows.core.evaluation.sampler import evaluate_weights
from flows.core.orchestration.cleanup import session_labels
from flows.core.records.run_records import artifact_key
from tasks.checkpoints import read_run
from tasks.lifecycle import close_session, create_run, finish_run, open_session
from tasks.names import CYCLE_CHECKPOINT
from tasks.operations import SequencedClient, WhitneyCalls
from tasks.retry import TaskRetrySettings
from whitney import wire
from whitney.uris import checkpoint_run_id

EVAL_SAMPLER = "eval"
"""The sampler a frozen run is evaluated on."""
RENDERING_FIELDS = ("evaluation.tokenizer", "evaluation.tokenizer", "evaluation.renderer")
"""The fields named when a checkpoint's base model, its tokenizer or renderer does not load:
the tokenizer setting names another tokenizer for a base model whose own is unavailable."""


class CheckpointEvaluation(BaseModel):
    """A checkpoint and what its evaluation measured."""

    checkpoint: str
    run_id: str = Field(description="The run that saved the checkpoint")
    cycle: int | None = Field(description="The cycle it was saved after (cycle-<n>), if named so")
    evaluation: EvalMetrics
    frozen_run_id: str = Field(description="The frozen run it was evaluated on")


def held_out_pairs(settings: EvalSettings) -> list[HeldOutPair]:
    """The held-out split of `settings.data` (the SFT flow's split of the same data), or none;
    ConfigError naming evaluation.data if it cannot be read."""
    if settings.data is None:
        return []
    from flows.sft.corpus import builtin_examples, read_examples
    from flows.sft.plan import held_out

    try:
        examples = builtin_examples() if settings.data == CORPUS else read_examples(settings.data)
    except ConfigError as error:
        raise ConfigError("evaluation.data", error.message) from None
    return [
        HeldOutPair(example.prompt, example.completion, tuple(example.conversation()))
        for example in (
            examples[index] for index in sorted(held_out(examples, settings.eval_fraction))
        )
    ]


def eval_plans(
    config: EvaluateConfig, connection: WhitneyConnection, checkpoints: Sequence[str]
) -> tuple[list[wire.Run], list[EvalPlan]]:
    """The run that saved each checkpoint, and each one's eval plan (rendered as training
    rendered: the settings' tokenizer and renderer on its run's base model); ConfigError
    naming the field when the settings do not load."""
    retry = config.task_retry
    runs = {
        run_id: WhitneyCalls(connection, retry).run(read_run, run_id)
        for run_id in dict.fromkeys(map(checkpoint_run_id, checkpoints))
    }
    pairs = held_out_pairs(config.evaluation)
    sources, plans = [], []
    for checkpoint in checkpoints:
        source = runs[checkpoint_run_id(checkpoint)]
        settings = config.evaluation
        renderer = load_renderer(
            source.base_model, settings.tokenizer, settings.renderer, RENDERING_FIELDS
        )
        try:
            plan = load_eval_plan(settings, renderer, pairs)
        except ConfigError as error:
            raise ConfigError(f"evaluation.{error.field}", error.message) from None
        sources.append(source)
        plans.append(plan)
    return sources, plans


@dataclass(frozen=True)
class CheckpointRuns:
    """A labelled session of this flow run attempt, with one run created from each checkpoint."""

    session_id: str
    runs: list[wire.Run]

    def client(self, connection: WhitneyConnection, retry: TaskRetrySettings) -> SequencedClient:
        """The ordered calls on the runs, from their first seq id."""
        return SequencedClient(
            connection, {run.run_id: run.next_seq_id for run in self.runs}, retry
        )

    def close(self, connection: WhitneyConnection, retry: TaskRetrySettings) -> None:
        """finish_run on every run, then close_session."""
        for run in self.runs:
            WhitneyCalls(connection, retry).run(finish_run, run.run_id)
        WhitneyCalls(connection, retry).run(close_session, self.session_id)


def runs_from_checkpoints(
    connection: WhitneyConnection,
    retry: TaskRetrySettings,
    purpose: str,
    checkpoints: Sequence[str],
    sources: Sequence[wire.Run],
    trainable: bool,
) -> CheckpointRuns:
    """open_session (labelled with the flow run, so the cleanup hooks find it) and a run from
    each checkpoint, of the base model and rank of the run that saved it (`sources`); their
    idempotency keys name this attempt and `purpose`."""
    flow_run = FlowRunContext.get().flow_run
    attempt = f"prefect-{flow_run.id}-{flow_run.run_count}-{purpose}"
    session = WhitneyCalls(connection, retry).run(
        open_session, session_labels(flow_run), f"{attempt}-session"
    )
    runs = [
        WhitneyCalls(connection, retry).run(
            create_run,
            session.session_id,
            source.provider,
            source.base_model,
            lora_rank=source.lora_rank,
            seed=0,
            idempotency_key=f"{attempt}-{index}",
            trainable=trainable,
            from_checkpoint=checkpoint,
        )
        for index, (checkpoint, source) in enumerate(zip(checkpoints, sources, strict=True))
    ]
    return CheckpointRuns(session.session_id, runs)


def evaluate_checkpoints(
    config: EvaluateConfig, connection: WhitneyConnection, checkpoints: Sequence[str]
) -> list[CheckpointEvaluation]:
    """Each checkpoint evaluated on a frozen run created from it (see the module docstring)."""
    sources, plans = eval_plans(config, connection, checkpoints)
    retry = config.task_retry
    frozen = runs_from_checkpoints(connection, retry, "frozen", checkpoints, sources, False)
    client = frozen.client(connection, retry)
    results = []
    for checkpoint, plan, run in zip(checkpoints, plans, frozen.runs, strict=True):
        match = CYCLE_CHECKPOINT.match(checkpoint)
        results.append(
            CheckpointEvaluation(
                checkpoint=checkpoint,
                run_id=checkpoint_run_id(checkpoint),
                cycle=int(match["cycle"]) if match else None,
                evaluation=evaluate_weights(client, run.run_id, EVAL_SAMPLER, plan),
                frozen_run_id=run.run_id,
            )
        )
    frozen.close(connection, retry)
    return results


def eval_set_name(settings: EvalSettings) -> str:
    """What was evaluated, in a few words: the environment and/or the data."""
    parts = [f"env {settings.env}"] if settings.env else []
    if settings.data:
        parts.append(f"data {settings.data} ({settings.eval_fraction:g} held out)")
    return ", ".join(parts)


def comparison_row(result: CheckpointEvaluation, settings: EvalSettings) -> dict[str, Any]:
    """A checkpoint's row of the comparison table."""
    metrics = result.evaluation
    return {
        "checkpoint": result.checkpoint.rsplit("/", 1)[1],
        "cycle": result.cycle,
        "reward_mean": metrics.reward_mean,
        "sampled_reward_mean": metrics.sampled_reward_mean,
        "pass_at_k": metrics.pass_at_k,
        "k": metrics.k,
        "loss": metrics.loss,
        "eval set": eval_set_name(settings),
        "uri": result.checkpoint,
    }


def comparison_key(run_id: str) -> str:
    """The key of the table comparing the checkpoints of `run_id` (one artifact, versioned)."""
    return artifact_key("checkpoint-evals", run_id)


def earlier_rows(key: str) -> list[dict[str, Any]]:
    """The rows of the latest table artifact keyed `key`, if there is one."""
    with get_client(sync_client=True) as prefect:
        latest = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    if not latest or not isinstance(latest[0].data, str):
        return []
    return list(json.loads(latest[0].data))


def record_comparison(result: CheckpointEvaluation, settings: EvalSettings) -> list[dict[str, Any]]:
    """A new version of the comparison table of the checkpoint's run: the rows of its earlier
    evaluations with this one's added (or replaced), in cycle order; its rows."""
    key = comparison_key(result.run_id)
    rows = {row["uri"]: row for row in earlier_rows(key)}
    rows[result.checkpoint] = comparison_row(result, settings)
    ordered = sorted(
        rows.values(),
        key=lambda row: (row["cycle"] is None, row["cycle"] or 0, row["checkpoint"]),
    )
    create_table_artifact(
        table=ordered,
        key=key,
        description=f"The checkpoints of Whitney run `{result.run_id}`, each evaluated on a "
        "frozen run (evaluate-checkpoint); the latest version lists every one evaluated so far",
    )
    return ordered
