"""The evaluate-checkpoint flow: any checkpoint evaluated on a frozen run, off the critical path.

    evaluate_checkpoint(checkpoint, config)   read the run that saved it; check the eval set
      open_session, create_run (frozen, from the checkpoint)
      save_weights_for_sampler `eval`, the eval set's samples [and logprobs], one block
      finish_run, close_session
      a new version of the table comparing the run's checkpoints (keyed per run)
      whitney.checkpoint.evaluated

The deployment `evaluate-checkpoint` (deployments/prefect.yaml) has a trigger on
`whitney.checkpoint.saved`: every checkpoint a training run saves starts one, with the eval
settings the event carries (those of the training flow's inline evaluation), so training never
waits for evaluation. Its runs go one at a time (`concurrency_limit: 1`): each adds its row to
the latest version of the table, so none is lost.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from blocks.endpoint import resolve_connection
from flows.checkpoints.comparison import (
    CheckpointEvaluation,
    evaluate_checkpoints,
    record_comparison,
)
from flows.checkpoints.config import CheckpointURI, EvaluateConfig
from flows.core.orchestration.cleanup import CLEANUP_HOOKS
from flows.core.records.events import checkpoint_evaluated


@flow(name="evaluate-checkpoint", persist_result=False, **CLEANUP_HOOKS)
def evaluate_checkpoint(
    checkpoint: CheckpointURI,
    config: EvaluateConfig | None = None,
    whitney_block: str | None = None,
) -> CheckpointEvaluation:
    """Evaluate a checkpoint on a frozen run created from it, and compare it with the earlier
    checkpoints of its run (a table artifact, keyed per run).

    Args:
        checkpoint: whitney://runs/<run>/states/<name>.
        config: The eval set and its sampling (`evaluation`), the Whitney URL, retries.
        whitney_block: A saved WhitneyCredentials block; empty: `config.api_url` (else
            WHITNEY_API_URL) with WHITNEY_API_KEY.
    """
    config = config or EvaluateConfig()
    connection = resolve_connection(config.api_url, whitney_block)
    (result,) = evaluate_checkpoints(config, connection, [checkpoint])
    rows = record_comparison(result, config.evaluation)
    metrics = result.evaluation
    get_run_logger().info(
        "%s: reward_mean %.4f, pass@%d %.4f%s (%d checkpoints of run %s compared)",
        checkpoint,
        metrics.reward_mean,
        metrics.k,
        metrics.pass_at_k,
        f", eval loss {metrics.loss:.4f}" if metrics.loss is not None else "",
        len(rows),
        result.run_id,
    )
    checkpoint_evaluated(checkpoint, result.cycle, metrics.model_dump())
    return result
