"""The RL flow: the page's ordered loop skeleton, one subflow run per cycle.

    rl_flow(config)                       open_session (labelled), create_run
      cycle-0 .. cycle-{n-1}              rl_cycle(config, cycle, run_id, seq_start)
        save_weights_for_sampler[seq=k]   -> sampler_id
        sample[seq=k+1 .. k+P]            one request per prompt, a reserved block of ids
        rewards, advantages, build_loss   (recipe calls through ctx take the next ids)
        forward_backward, optim_step
      save_state, export_lora, finish_run, close_session

Every operation is a task with an explicit seq id. A cycle starts at the id where the previous
one ended and allocates deterministically, so a retried cycle replays: completed operations
come back from the server's journal, the rest run once.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime
from typing import Any

from prefect import flow
from prefect.context import FlowRunContext

from flows.cancellation import CancellationWatch
from flows.cleanup import CLEANUP_HOOKS, session_labels
from flows.config import RLConfig
from flows.connection import resolve_connection
from flows.context import LossContext, SequencedClient
from flows.heartbeat import subflows_without_heartbeat
from flows.metrics import AdapterExport, CycleMetrics, RLResult
from flows.operation_log import OperationLog
from flows.recipes import join_payloads
from flows.records import RunRecords, record_cycle_table
from flows.rl_plan import RLPlan, check_rl_config, load_rl_plan
from flows.scoring import GroupScore, score_group
from flows.sequencing import SeqLedger
from tasks.lifecycle import close_session, create_run, finish_run, open_session
from tasks.retry import with_retry
from whitney.payloads import adamw_optimizer, result_sampler_id


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
        op_seconds=dict(log.seconds),
        wall_seconds=wall_seconds,
    )


def run_cycle(plan: RLPlan, client: SequencedClient, cycle: int, run_id: str) -> CycleMetrics:
    """The page's loop body for one cycle, every call through `client` (the cycle's ledger)."""
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    config = plan.config
    seq_start = client.ledger.position(run_id)
    sampler = client.run_operation(run_id, "save_weights_for_sampler", {})
    sampler_id = result_sampler_id(sampler)
    prompts, requests = plan.sample_requests(cycle)
    samples = sample_groups(client, run_id, sampler_id, requests, config.concurrent_sampling)
    scores = [
        score_group(plan.environment, plan.tokenizer, prompt, sample, config.advantages)
        for prompt, sample in zip(prompts, samples, strict=True)
    ]
    payloads = [
        plan.recipe.build_loss(
            sample,
            cycle,
            request,
            LossContext(
                client=client,
                run_id=run_id,
                sampler_id=sampler_id,
                provider=config.provider,
                loss_config=dict(config.loss_config),
                rewards=score.rewards,
                advantages=score.advantages,
            ),
        )
        for sample, request, score in zip(samples, requests, scores, strict=True)
    ]
    backward = client.run_operation(run_id, "forward_backward", join_payloads(payloads))
    optimizer = adamw_optimizer(config.learning_rate, grad_clip_norm=config.grad_clip_norm)
    optimized = client.run_operation(run_id, "optim_step", {"optimizer": optimizer})
    return cycle_metrics(
        cycle,
        started_at,
        seq_start,
        client.ledger.position(run_id),
        scores,
        backward,
        optimized,
        client.log,
        time.perf_counter() - started,
    )


@flow(name="rl-cycle", flow_run_name="cycle-{cycle}", persist_result=False, **CLEANUP_HOOKS)
def rl_cycle(
    config: RLConfig, cycle: int, run_id: str, seq_start: int, whitney_block: str | None = None
) -> CycleMetrics:
    """One RL cycle from `seq_start`; returns its metrics, with the seq id the next starts at.

    Retried by replaying: the same calls with the same seq ids, answered from the journal.
    """
    client = SequencedClient(
        resolve_connection(config.api_url, whitney_block),
        SeqLedger({run_id: seq_start}),
        config.task_retry,
        OperationLog(),
    )
    metrics = run_cycle(load_rl_plan(config), client, cycle, run_id)
    record_cycle_table(metrics)
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
    check_rl_config(config)  # fails closed before anything is allocated
    connection = resolve_connection(config.api_url, whitney_block)
    flow_run = FlowRunContext.get().flow_run
    attempt = f"prefect-{flow_run.id}-{flow_run.run_count}"
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
    )
    records = RunRecords(f"rl-{flow_run.name}", config.cycles, config.metrics_path)
    cycle_flow = rl_cycle.with_options(
        retries=config.cycle_retries, retry_delay_seconds=config.cycle_retry_delay_s
    )
    seq = run.next_seq_id
    with CancellationWatch(flow_run.id) as cancellation, subflows_without_heartbeat():
        for cycle in range(config.cycles):
            cancellation.raise_if_requested()
            metrics = cycle_flow(config, cycle, run.run_id, seq, whitney_block)
            seq = metrics.seq_end
            records.add_cycle(metrics)

    client = SequencedClient(
        connection, SeqLedger({run.run_id: seq}), config.task_retry, OperationLog()
    )
    checkpoint = client.run_operation(run.run_id, "save_state", {})
    adapter = client.run_operation(run.run_id, "export_lora", {})
    with_retry(finish_run, config.task_retry)(connection, run.run_id)
    with_retry(close_session, config.task_retry)(connection, session.session_id)
    result = RLResult(
        session_id=session.session_id,
        run_id=run.run_id,
        checkpoint=checkpoint["checkpoint"],
        adapter=AdapterExport.model_validate(adapter),
        cycles=records.cycles,
    )
    records.add_summary(result)
    return result
