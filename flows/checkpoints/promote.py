"""The promote-checkpoint flow: from a checkpoint to an approved, exported model, with a
person in the loop.

    promote_checkpoint(config)            target_dir/merged and target_dir/adapter new or empty
      the candidates                      `checkpoint`, or every checkpoint `run_id` saved
      evaluate each on a frozen run       (flows.checkpoints.comparison; the session is closed)
      the evaluation artifact             every candidate's numbers, the chosen one marked
      pause_flow_run(PromotionDecision)   the UI's resume form: approve, a note; the
                                          evaluation is its description. Nothing is open on
                                          Whitney while it waits
      the decision artifact, whitney.promotion.decided
      approved: a trainable run created from the checkpoint, export_lora, finish, close; then
        `whitney-flows export RUN --out target_dir/merged --merged` and
        `whitney-flows export RUN --out target_dir/adapter` (issue 8's export, as a user runs
        it), the approval added to each directory's manifest.json (flows.core.records.manifest); a
        link artifact to target_dir
      rejected: ends there, nothing exported; no decision within approval_timeout_s: the
        same, recorded, and the run fails (Prefect fails a pause that times out)

The export runs the `whitney-flows export` command in a child process: the same code, files
and checks a user gets from the command line; its key goes in the child's environment
(WHITNEY_API_KEY), never on its command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run as current_flow_run
from pydantic import BaseModel, Field

from blocks.connection import WhitneyConnection
from blocks.endpoint import resolve_connection
from flows.checkpoints.comparison import (
    CheckpointEvaluation,
    eval_set_name,
    evaluate_checkpoints,
    runs_from_checkpoints,
)
from flows.checkpoints.config import LOWER_IS_BETTER, PromoteConfig
from flows.core.config import ConfigError
from flows.core.orchestration.cleanup import CLEANUP_HOOKS
from flows.core.records.events import promotion_decided
from flows.core.records.manifest import add_promotion
from tasks.checkpoints import list_checkpoints, read_run
from tasks.operations import WhitneyCalls
from whitney import wire
from whitney.client import API_KEY_ENV
from whitney.uris import checkpoint_run_id

POLL_INTERVAL_S = 2
"""How often the paused run asks whether it was resumed."""
EXPORT_TIMEOUT_S = 900
EXPORTS = (("merged", ["--merged"]), ("adapter", []))
"""The directories under target_dir and the export command's options for each."""


class PromotionDecision(RunInput):
    """The approval form the Prefect UI shows while the run is paused."""

    approve: bool = Field(
        default=False,
        description="Export this checkpoint: its merged model and its PEFT adapter, to the "
        "target directory",
    )
    note: str = Field(default="", max_length=2000, description="Why (kept with the decision)")


class PromotionResult(BaseModel):
    """What promote-checkpoint decided and where the model went."""

    checkpoint: str
    metric: str
    candidates: list[CheckpointEvaluation]
    approved: bool
    note: str
    target_dir: str | None = Field(default=None, description="Where the model went, if approved")
    export_run_id: str | None = Field(default=None, description="The run the export came from")
    adapter_sha256: str | None = None


def check_targets(target_dir: Path) -> None:
    """ConfigError unless target_dir/merged and target_dir/adapter are new or empty."""
    for name, _ in EXPORTS:
        target = target_dir / name
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise ConfigError("target_dir", f"{target} exists and is not an empty directory")


def best(candidates: list[CheckpointEvaluation], metric: str) -> CheckpointEvaluation:
    """The candidate with the most `metric` (the least for a loss); the earliest of equals."""
    sign = 1.0 if metric in LOWER_IS_BETTER else -1.0
    return min(candidates, key=lambda c: sign * float(getattr(c.evaluation, metric)))


def evaluation_markdown(
    candidates: list[CheckpointEvaluation], chosen: CheckpointEvaluation, config: PromoteConfig
) -> str:
    """The evaluation a person decides on: every candidate's numbers, the chosen one first."""
    lines = [
        f"**Promote `{chosen.checkpoint}`?**",
        "",
        f"Chosen by `{config.metric}` among {len(candidates)} checkpoint(s); eval set: "
        f"{eval_set_name(config.evaluation)}, k = {config.evaluation.group_size}. Approved, it is "
        f"exported to `{config.target_dir}/merged` and `{config.target_dir}/adapter`.",
        "",
        "| checkpoint | reward_mean | sampled_reward_mean | pass_at_k | loss |",
        "| --- | --- | --- | --- | --- |",
    ]
    for candidate in sorted(candidates, key=lambda c: c is not chosen):
        metrics = candidate.evaluation
        loss = f"{metrics.loss:.4f}" if metrics.loss is not None else "-"
        mark = " (chosen)" if candidate is chosen else ""
        lines.append(
            f"| `{candidate.checkpoint}`{mark} | {metrics.reward_mean:.4f} | "
            f"{metrics.sampled_reward_mean:.4f} | {metrics.pass_at_k:.4f} | {loss} |"
        )
    return "\n".join(lines)


def export_checkpoint(
    config: PromoteConfig, connection: WhitneyConnection, checkpoint: str
) -> wire.Operation:
    """A trainable run created from the checkpoint (its own session), its export_lora, finish,
    close: the checkpoint's weights as an export archive; the export_lora operation."""
    retry = config.task_retry
    source = WhitneyCalls(connection, retry).run(read_run, checkpoint_run_id(checkpoint))
    exporting = runs_from_checkpoints(connection, retry, "export", [checkpoint], [source], True)
    (run,) = exporting.runs
    exported = exporting.client(connection, retry).execute(run.run_id, "export_lora", {})
    exporting.close(connection, retry)
    return exported


def run_export_command(
    connection: WhitneyConnection, run_id: str, out: Path, options: list[str]
) -> str:
    """`whitney-flows export RUN_ID --out OUT [--merged] --api-url URL`, in a child process
    with the key in its environment; its output. RuntimeError with its last lines if it fails."""
    argv = [sys.executable, "-m", "flows.cli.main", "export", run_id, "--out", str(out)]
    argv += [*options, "--api-url", connection.base_url]
    environment = {**os.environ, API_KEY_ENV: connection.api_key.get_secret_value()}
    completed = subprocess.run(
        argv, env=environment, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S
    )
    output = (completed.stdout + completed.stderr).strip()
    if completed.returncode != 0:
        raise RuntimeError(f"whitney-flows export exited {completed.returncode}: {output[-2000:]}")
    return output


def record_decision(checkpoint: str, decision: PromotionDecision, target_dir: Path | None) -> None:
    """The decision and its note: an artifact, a log line, `whitney.promotion.decided`."""
    verdict = "approved" if decision.approve else "rejected"
    note = decision.note or "-"
    create_markdown_artifact(
        markdown=f"**{verdict.capitalize()}**: `{checkpoint}`\n\nNote: {note}",
        description="The promotion decision",
    )
    get_run_logger().info("Promotion of %s %s: %s", checkpoint, verdict, note)
    target = str(target_dir) if decision.approve and target_dir is not None else None
    promotion_decided(checkpoint, decision.approve, decision.note, target)


@flow(name="promote-checkpoint", persist_result=False, **CLEANUP_HOOKS)
def promote_checkpoint(config: PromoteConfig, whitney_block: str | None = None) -> PromotionResult:
    """Evaluate a checkpoint (or every checkpoint of a run, choosing the best by a metric),
    pause for a person's approval in the UI, then export the merged model and the PEFT adapter.

    Args:
        config: Which checkpoint, the eval set, the target directory, the approval timeout.
        whitney_block: A saved WhitneyCredentials block; empty: `config.api_url` (else
            WHITNEY_API_URL) with WHITNEY_API_KEY.
    """
    logger = get_run_logger()
    target_dir = Path(config.target_dir).absolute()
    check_targets(target_dir)
    connection = resolve_connection(config.api_url, whitney_block)
    if config.checkpoint is not None:
        checkpoints = [config.checkpoint]
    else:
        checkpoints = WhitneyCalls(connection, config.task_retry).run(
            list_checkpoints, config.run_id
        )
        if not checkpoints:
            raise ConfigError("run_id", f"run {config.run_id} saved no checkpoint")
    candidates = evaluate_checkpoints(config, connection, checkpoints)
    chosen = best(candidates, config.metric)
    markdown = evaluation_markdown(candidates, chosen, config)
    create_markdown_artifact(markdown=markdown, description="The checkpoint proposed for promotion")
    logger.info("Waiting for approval of %s (the run's Resume form)", chosen.checkpoint)
    try:
        decision = pause_flow_run(
            wait_for_input=PromotionDecision.with_initial_data(description=markdown),
            timeout=config.approval_timeout_s,
            poll_interval=POLL_INTERVAL_S,
        )
    except FlowPauseTimeout:
        note = f"no decision within {config.approval_timeout_s} s"
        record_decision(chosen.checkpoint, PromotionDecision(approve=False, note=note), None)
        raise  # Prefect fails a run that was paused and never resumed
    result = PromotionResult(
        checkpoint=chosen.checkpoint,
        metric=config.metric,
        candidates=candidates,
        approved=decision.approve,
        note=decision.note,
    )
    record_decision(chosen.checkpoint, decision, target_dir)
    if not decision.approve:
        return result
    exported = export_checkpoint(config, connection, chosen.checkpoint)
    adapter = exported.result_as(wire.ExportLoraResult)
    approval = {
        "approved": True,
        "note": decision.note,
        "checkpoint": chosen.checkpoint,
        "metric": config.metric,
        "evaluation": chosen.model_dump(mode="json"),
        "flow_run_id": str(current_flow_run.id),
    }
    for name, options in EXPORTS:
        logger.info(run_export_command(connection, exported.run_id, target_dir / name, options))
        add_promotion(target_dir / name, approval)  # in the manifest the export wrote
    create_link_artifact(
        link=target_dir.as_uri(),
        link_text=str(target_dir),
        description=f"`{chosen.checkpoint}`, approved: merged/ (one model) and adapter/ (PEFT); "
        f"adapter sha256 {adapter.sha256}",
    )
    return result.model_copy(
        update={
            "target_dir": str(target_dir),
            "export_run_id": exported.run_id,
            "adapter_sha256": adapter.sha256,
        }
    )
