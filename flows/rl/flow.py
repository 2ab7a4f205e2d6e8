"""The RL flow: the page's ordered loop skeleton, one subflow run per cycle.

    rl_flow(config)                       resume point (flows.core.resume), open_session
                                          (labelled), create_run (from_checkpoint if resuming),
                                          the recipe's auxiliary runs (flows.rl.auxiliary)
      cycle-{first} .. cycle-{n-1}        rl_cycle(config, cycle, run_id, seq_start, sampler_id)
        save_weights_for_sampler[seq=k]   -> sampler_id (the first cycle, or unpipelined only)
        sample[seq=k+1 .. k+P]            one request per prompt, a reserved block of ids
        rewards, advantages, build_loss   (recipe calls through ctx take the next ids)
        [resampling, finish_cycle]        flows.rl.batch: uniform groups resampled or dropped;
                                          the recipe's cycle end (a critic's update)
        forward_backward, optim_step      the tail (flows.rl.pipeline): pipelined, submitted
        [save_state cycle-{n}]            together with the checkpoint when one is due and
        [save_weights_for_sampler]        the next cycle's sampler, named cycle-{n+1}
      save_state cycle-{n-1}, export_lora, finish_run, close_session

Every operation is a task with an explicit seq id. A cycle starts at the id where the previous
one ended and allocates deterministically, so a retried cycle replays: completed operations
come back from the server's journal, the rest run once. A retried flow run, or one given
`resume_from`, continues on a new run from a `cycle-{n}` checkpoint (flows.core.resume).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.context import FlowRunContext

from flows.core.budget import BudgetGuard, flow_cost_model
from flows.core.cancellation import CancellationWatch
from flows.core.checkpoints import check_resume_from, checkpoint_due, checkpoint_name
from flows.core.cleanup import CLEANUP_HOOKS
from flows.core.connection import resolve_connection
from flows.core.cost import format_cost, format_usage
from flows.core.cycle_operations import RecordingLog, by_run, record_cycle_operations
from flows.core.heartbeat import subflows_without_heartbeat
from flows.core.operation_log import OperationLog
from flows.core.records import RunRecords, record_cycle_table, run_rows
from flows.core.sequenced_client import SequencedClient
from flows.core.sequencing import SeqLedger
from flows.core.summary import first_and_last
from flows.core.training import (
    export_adapter,
    release_training_run,
    save_final_state,
    start_training_run,
)
from flows.rl.auxiliary import (
    AuxiliaryHandle,
    advanced,
    ledger_starts,
    open_auxiliary_runs,
    save_auxiliary_checkpoints,
    seq_ends,
)
from flows.rl.batch import build_training_batch
from flows.rl.config import RLConfig
from flows.rl.metrics import CycleMetrics, RLResult
from flows.rl.pipeline import publish_sampler, run_tail, sampler_name
from flows.rl.plan import RLPlan, check_rl_config, load_rl_plan
from flows.rl.scoring import GroupScore
from whitney.payloads import adamw_optimizer


def sample_groups(
    client: SequencedClient,
    run_id: str,
    sampler_id: str,
    requests: list[dict[str, Any]],
    concurrent: bool,
) -> list[dict[str, Any]]:
    """One sample result per request: submitted together on a reserved block of seq ids, or
    one after another (the same ids either way)."""
    if concurrent:
        operations = client.fan_out(run_id, sampler_id, "sample", requests)
        return [operation.result or {} for operation in operations]
    return [client.sampler_operation(run_id, sampler_id, "sample", request) for request in requests]


def cycle_metrics(
    cycle: int,
    started_at: datetime,
    seq_start: int,
    seq_end: int,
    scores: list[GroupScore],
    backward: dict[str, Any],
    optimized: dict[str, Any],
    log: OperationLog,
    wall_seconds: float,
) -> CycleMetrics:
    """The cycle's record from its scores, its two training results and its operation log."""
    rewards = [reward for score in scores for reward in score.rewards]
    return CycleMetrics(
        cycle=cycle,
        started_at=started_at,
        seq_start=seq_start,
        seq_end=seq_end,
        reward_mean=statistics.fmean(rewards),
        reward_std=statistics.pstdev(rewards),
        all_zero_group_share=sum(score.uniform for score in scores) / len(scores),
        loss=float(backward["loss"]),
        grad_norm=float(optimized.get("metrics", {}).get("grad_norm", 0.0)),
        kl_sample_train=backward.get("metrics", {}).get("kl_sample_train:mean"),
        tokens_sampled=log.tokens("sample", "sampled_tokens"),
        tokens_trained=log.tokens("forward_backward", "trained_tokens"),
        usage={kind: dict(counters) for kind, counters in log.usage.items()},
        op_seconds=dict(log.seconds),
        wall_seconds=wall_seconds,
    )


def run_cycle(
    plan: RLPlan,
    client: SequencedClient,
    cycle: int,
    run_id: str,
    sampler_id: str | None = None,
    auxiliary: Sequence[AuxiliaryHandle] = (),
) -> CycleMetrics:
    """The page's loop body for one cycle, every call through `client` (the cycle's ledger).

    `sampler_id`: the sampler the previous cycle published (pipelined); None: this cycle
    publishes its own first. The tail is `flows.rl.pipeline.run_tail`. `auxiliary`: the runs
    the recipe declared (their seq ids are in the ledger too); the middle of the cycle
    (scores, resampling, build_loss, the recipe's finish_cycle) is `flows.rl.batch`.
    """
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    config = plan.config
    seq_start = client.ledger.position(run_id)
    if sampler_id is None:
        sampler_id = publish_sampler(client, run_id, cycle, named=config.pipelined)
    prompts, requests = plan.sample_requests(cycle)
    samples = sample_groups(client, run_id, sampler_id, requests, config.concurrent_sampling)
    resample = functools.partial(
        sample_groups, client, run_id, sampler_id, concurrent=config.concurrent_sampling
    )
    batch = build_training_batch(
        plan, client, cycle, run_id, sampler_id, prompts, requests, samples, resample, auxiliary
    )
    checkpoint = checkpoint_due(cycle, config.checkpoint_every, config.cycles)
    if checkpoint:
        save_auxiliary_checkpoints(client, auxiliary, cycle)  # a critic's, beside the policy's
    optimizer = adamw_optimizer(config.learning_rate, grad_clip_norm=config.grad_clip_norm)
    tail = run_tail(
        client,
        run_id,
        cycle,
        batch.payload,
        optimizer,
        checkpoint=checkpoint,
        pipelined=config.pipelined,
        last=cycle == config.cycles - 1,
    )
    backward, optimized = tail.backward, tail.optimized
    metrics = cycle_metrics(
        cycle,
        started_at,
        seq_start,
        client.ledger.position(run_id),
        batch.scores,
        backward,
        optimized,
        client.log,
        time.perf_counter() - started,
    )
    return metrics.model_copy(
        update={
            "groups_resampled": batch.groups_resampled,
            "groups_dropped": batch.groups_dropped,
            "recipe_metrics": batch.recipe_metrics,
            "auxiliary_seq_end": seq_ends(auxiliary, client.ledger),
        }
    )


def add_summary(records: RunRecords, result: RLResult) -> UUID:
    """The RL flow run's final markdown summary: the checkpoint, the exported adapter, the
    reward over the first and last cycles."""
    rewards = first_and_last("reward", result.cycles, lambda cycle: cycle.reward_mean, 5)
    rows = [
        ("cycles", str(len(result.cycles))),
        *((label, f"{reward:.3f}") for label, reward in rewards),
        ("tokens", format_usage(result.usage)),
        ("estimated cost", format_cost(result.cost)),
    ]
    if result.budget_stop:
        rows.append(("stopped early", result.budget_stop))
    return records.add_markdown_summary(
        "RL flow summary",
        rows + run_rows(result),
        "Checkpoint and exported adapter of the RL flow run",
    )


@flow(name="rl-cycle", flow_run_name="cycle-{cycle}", persist_result=False, **CLEANUP_HOOKS)
def rl_cycle(
    config: RLConfig,
    cycle: int,
    run_id: str,
    seq_start: int,
    whitney_block: str | None = None,
    sampler_id: str | None = None,
    auxiliary: list[AuxiliaryHandle] | None = None,
) -> CycleMetrics:
    """One RL cycle from `seq_start`; returns its metrics, with the seq id the next starts at.
    `sampler_id`: the sampler the previous cycle published (pipelined), else None.
    `auxiliary`: the recipe's auxiliary runs, each with the seq id this cycle starts at.

    Retried by replaying: the same calls with the same seq ids, answered from the journal.
    """
    client = SequencedClient(
        resolve_connection(config.api_url, whitney_block),
        SeqLedger({run_id: seq_start, **ledger_starts(auxiliary or [])}),
        config.task_retry,
        RecordingLog(),
    )
    metrics = run_cycle(load_rl_plan(config), client, cycle, run_id, sampler_id, auxiliary or [])
    record_cycle_table(metrics)
    record_cycle_operations(cycle, by_run(client.log.operations, {run_id: "policy"}))
    return metrics


@flow(name="rl", persist_result=False, **CLEANUP_HOOKS)
def rl_flow(config: RLConfig, whitney_block: str | None = None) -> RLResult:
    """Train a LoRA adapter by RL on Whitney: validate, open a labelled session and a run,
    run `config.cycles` cycle subflows, then save_state, export_lora, finish, close.

    Args:
        config: The RL configuration.
        whitney_block: Name of a saved WhitneyCredentials block; empty: config.api_url or
            WHITNEY_API_URL, with WHITNEY_API_KEY.
    """
    plan = check_rl_config(config)  # fails closed before anything is allocated
    check_resume_from(config.resume_from, config.cycles)
    connection = resolve_connection(config.api_url, whitney_block)
    guard = BudgetGuard(config.budget, flow_cost_model(config.prices, whitney_block))
    flow_run = FlowRunContext.get().flow_run
    training = start_training_run(config, connection)
    start, run_id = training.start, training.run_id
    auxiliary = open_auxiliary_runs(
        connection, training.session_id, config, plan.recipe, training.attempt, start.checkpoints
    )
    records = RunRecords(
        f"rl-{flow_run.name}", config.cycles - start.first_cycle, config.metrics_path
    )
    cycle_flow = rl_cycle.with_options(
        retries=config.cycle_retries, retry_delay_seconds=config.cycle_retry_delay_s
    )
    seq, sampler_id, last_cycle = training.next_seq_id, None, start.first_cycle - 1
    with CancellationWatch(flow_run.id) as cancellation, subflows_without_heartbeat():
        for cycle in range(start.first_cycle, config.cycles):
            cancellation.raise_if_requested()
            if (reason := guard.stop_reason(cycle)) is not None:  # flows.core.budget
                get_run_logger().warning("%s: saving, exporting and closing now", reason)
                break
            metrics = cycle_flow(
                config, cycle, run_id, seq, whitney_block, sampler_id, auxiliary=auxiliary
            )
            metrics = metrics.model_copy(update={"cost": guard.add_cycle(metrics.usage)})
            last_cycle = cycle
            seq = metrics.seq_end
            auxiliary = advanced(auxiliary, metrics.auxiliary_seq_end)
            sampler_id = sampler_name(cycle + 1) if config.pipelined else None
            records.add_cycle(metrics)

    ledger = SeqLedger({run_id: seq, **ledger_starts(auxiliary)})
    client = SequencedClient(connection, ledger, config.task_retry, OperationLog())
    checkpoint = save_final_state(client, run_id, checkpoint_name(last_cycle))  # a resume point
    save_auxiliary_checkpoints(client, auxiliary, last_cycle)
    adapter = export_adapter(client, run_id)
    release_training_run(training, config, [handle.run_id for handle in auxiliary])
    result = RLResult(
        session_id=training.session_id,
        run_id=run_id,
        checkpoint=checkpoint,
        adapter=adapter,
        cycles=records.cycles,
        resumed_from=start.checkpoint,
        usage=guard.used,
        cost=guard.cost,
        budget_stop=guard.stopped,
    )
    add_summary(records, result)
    return result
