"""The RL flow: the ordered loop skeleton of Whitney's Loop building blocks, one subflow run
per cycle (the outer loop: flows.core.loop.cycles).

    rl_flow(config)                       resume point (tasks.resume), open_session
                                          (labelled), create_run (from_checkpoint if resuming),
                                          the recipe's auxiliary runs (flows.rl.auxiliary)
      cycle-{first} .. cycle-{n-1}        rl_cycle(config, cycle, start): from the seq ids
                                          the loop carries (flows.core.loop.cycles)
        save_weights_for_sampler[seq=k]   -> sampler_id (the first cycle, or unpipelined only)
        sample[seq=k+1 .. k+P]            one request per prompt, a reserved block of ids
        rewards, advantages, build_loss   (recipe calls through ctx take the next ids)
        [resampling, finish_cycle]        flows.rl.batch: uniform groups resampled or dropped;
                                          the recipe's cycle end (a critic's update)
        forward_backward, optim_step      the tail (CycleContext.run_tail): pipelined,
        [save_state cycle-{n}]            submitted together with the checkpoint when one is
        [save_weights_for_sampler]        due and the next cycle's sampler, named cycle-{n+1}
      save_state cycle-{n-1}, export_lora, finish_run, close_session

Every operation is a task with an explicit seq id. A cycle starts at the id where the previous
one ended and allocates deterministically, so a retried cycle replays: completed operations
come back from the server's journal, the rest run once. A retried flow run, or one given
`resume_from`, continues on a new run from a `cycle-{n}` checkpoint (tasks.resume).

Pipelining: a cycle waits only where it needs a result.

The Loop building blocks' loop waits for every answer in turn. A cycle needs only two of them:
the samples (build_loss reads them) and, at its end, the training results (its record). So a
pipelined cycle submits its tail (forward_backward, optim_step, the `save_state` checkpoint
when one is due, and the `save_weights_for_sampler` that publishes the next cycle's sampler)
back to back as task futures with consecutive seq ids, and waits for them together: one round
trip instead of three or four. The sampler is named `cycle-{n+1}`; with a name, the sampler
id is known before the answer (docs/api.md), so the next cycle samples from it with no
save_weights_for_sampler call of its own. The first cycle a flow runs publishes its own.

The server executes a run's operations strictly in seq order, so the weights each sampler
snapshots, and therefore the samples and the adapter, are those of one call after another; only
the seq-id layout differs (a cycle's ids no longer start with its save_weights_for_sampler). A
retried cycle resubmits the same ids and replays.

Off-policy (`max_staleness` > 0, flows.core.loop.off_policy_schedule): a cycle also requests the
samples
of the later cycles its sampler serves, which the server samples while this cycle trains, and reads
its own back from the journal when an earlier cycle requested them (`sample_cycle`); clipped losses
then clip around the current weights (flows.rl.off_policy).

One thing pipelining changes: operations are on the server before the one ahead of them has
answered. If that one is refused before it is journaled (a 4xx), its seq id stays a gap and
those behind it would wait out the server's gap timeout; if it fails in execution, they run
anyway. Neither can be repaired by a replay (the same request gets the same answer), so on a
non-retryable failure in the tail the cycle cancels the run (the operations waiting behind the
failure end at once: `SequencedClient.collect`) and fails; a retried flow run resumes from a
checkpoint that precedes the failure (`tasks.resume`).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from uuid import UUID

from prefect import flow

from blocks.endpoint import resolve_connection
from flows.core.config import checkpoint_due
from flows.core.evaluation.sampler import evaluate_after_cycle, evaluate_at_start
from flows.core.loop.budget import BudgetGuard, flow_cost_model
from flows.core.loop.context import CycleContext, CycleTail
from flows.core.loop.cost import format_cost, format_usage
from flows.core.loop.cycles import CycleStart, cycle_subflow, run_cycles
from flows.core.loop.off_policy_schedule import Schedule
from flows.core.loop.sampling_ahead import CycleSamples, sample_ahead
from flows.core.loop.training import end_training_run, start_training_run
from flows.core.orchestration.cleanup import CLEANUP_HOOKS
from flows.core.records.run_records import RunRecords, run_rows
from flows.core.records.summary_parts import first_and_last
from flows.rl.auxiliary import (
    AuxiliaryHandle,
    ledger_starts,
    open_auxiliary_runs,
    save_auxiliary_checkpoints,
    seq_ends,
)
from flows.rl.batch import GroupRewards, GroupScore, TrainingBatch, build_training_batch
from flows.rl.config import RLConfig
from flows.rl.judge import Judge, JudgeHandle, open_judge_run
from flows.rl.metrics import CycleMetrics, RLResult, learning_curves
from flows.rl.multi_turn_batch import build_episode_batch
from flows.rl.off_policy import decouple, decouples, logprobs_requests
from flows.rl.plan import RLPlan, check_rl_config
from tasks.names import cycle_name
from tasks.sequenced_client import Call, OperationLog, SequencedClient
from whitney.payloads import adamw_optimizer


def cycle_metrics(
    cycle: int,
    started_at: datetime,
    seq_start: int,
    seq_end: int,
    scores: list[GroupScore],
    tail: CycleTail,
    log: OperationLog,
    wall_seconds: float,
) -> CycleMetrics:
    """The cycle's record from its scores, its training tail and its operation log."""
    rewards = [reward for score in scores for reward in score.rewards]
    return CycleMetrics(
        cycle=cycle,
        started_at=started_at,
        seq_start=seq_start,
        seq_end=seq_end,
        reward_mean=statistics.fmean(rewards),
        reward_std=statistics.pstdev(rewards),
        all_zero_group_share=sum(score.uniform for score in scores) / len(scores),
        loss=tail.backward.loss,
        grad_norm=tail.optimized.metrics.get("grad_norm", 0.0),
        kl_sample_train=tail.backward.metrics.get("kl_sample_train:mean"),
        tokens_sampled=log.tokens("sample", "sampled_tokens"),
        tokens_trained=log.tokens("forward_backward", "trained_tokens"),
        usage={kind: dict(counters) for kind, counters in log.usage.items()},
        op_seconds=dict(log.seconds),
        wall_seconds=wall_seconds,
    )


def sample_cycle(
    plan: RLPlan, ctx: CycleContext, sampler_id: str, schedule: Schedule
) -> CycleSamples:
    """The cycle's samples. On-policy (max_staleness 0): its own requests on `sampler_id`,
    together or one by one. Off-policy: `flows.core.loop.sampling_ahead.sample_ahead`."""
    config = plan.config
    if config.max_staleness == 0:
        requests = plan.sample_requests(ctx.cycle)[1]
        samples = ctx.sampler_calls(sampler_id, "sample", requests, config.concurrent_sampling)
        return CycleSamples(sampler_id, samples, [])
    return sample_ahead(
        ctx.client,
        ctx.run_id,
        ctx.cycle,
        sampler_id,
        schedule,
        lambda later: plan.sample_requests(later)[1],
        ctx.presampled,
    )


def run_cycle(
    plan: RLPlan,
    ctx: CycleContext,
    auxiliary: Sequence[AuxiliaryHandle] = (),
    judge: JudgeHandle | None = None,
) -> CycleMetrics:
    """The loop body of one cycle, every call through the context's client (the cycle's
    ledger).

    Pipelined, a cycle after the flow run's first cycle samples from the sampler the
    previous cycle published (`cycle-{n}`); otherwise it publishes its own first. Its samples
    come from `sample_cycle` (with max_staleness, from an older sampler; the context's
    `presampled`: the later cycles' requests already made). The tail is the context's
    `run_tail` (flows.core.loop.context).
    `auxiliary`: the runs the recipe declared (their seq ids are in the ledger too). The
    middle of the cycle (scores, resampling, build_loss, the recipe's finish_cycle) is
    `flows.rl.batch`; with a multi-turn environment (on-policy only), `flows.rl.multi_turn_batch`
    plays the episodes turn by turn instead. `judge`: the judge run that rewards the
    completions (flows.rl.judge), if any.
    """
    started_at = datetime.now(UTC)
    config = plan.config
    client, cycle, run_id, first_cycle = ctx.client, ctx.cycle, ctx.run_id, ctx.first_cycle
    seq_start = client.ledger.position(run_id)
    eval_before = None
    if config.eval_at_start and cycle == 0 and plan.evaluation is not None:
        eval_before = evaluate_at_start(client, run_id, plan.evaluation)
    eval_tokens = client.log.tokens("sample", "sampled_tokens")  # not the cycle's own
    started = time.perf_counter()
    if config.pipelined and cycle > first_cycle:
        sampler_id = cycle_name(cycle)
    else:
        sampler_id = ctx.publish_sampler(named=config.pipelined)
    schedule = Schedule(config.max_staleness, first_cycle, config.checkpoint_every, config.cycles)
    if plan.multi_turn:  # episodes of several turns, on-policy: flows.rl.multi_turn_batch
        sampling = CycleSamples(sampler_id, [], [])
        batch = build_episode_batch(plan, ctx, sampler_id, auxiliary)
    else:
        sampling = sample_cycle(plan, ctx, sampler_id, schedule)
        batch = single_turn_batch(plan, ctx, sampling, auxiliary, judge)
    staleness = schedule.staleness_of(cycle)
    payload, kl_sample_train = batch.payload, None
    if decouples(payload["loss_function"], staleness, config.proximal_clip):
        calls = [Call("logprobs", request, sampler_id) for request in logprobs_requests(payload)]
        current = [row for op in client.run_block(run_id, calls) for row in op.result["logprobs"]]
        payload, kl_sample_train = decouple(payload, current)
    checkpoint = checkpoint_due(cycle, config.checkpoint_every, config.cycles)
    if checkpoint:
        save_auxiliary_checkpoints(client, auxiliary, cycle)  # a critic's, beside the policy's
    optimizer = adamw_optimizer(config.learning_rate, grad_clip_norm=config.grad_clip_norm)
    tail = ctx.run_tail(
        payload,
        optimizer,
        checkpoint=checkpoint,
        publish_next=config.pipelined and cycle < config.cycles - 1,
        together=config.pipelined,
    )
    sampling.wait_ahead(client)  # the later cycles' samples ran beside this training
    metrics = cycle_metrics(
        cycle,
        started_at,
        seq_start,
        client.ledger.position(run_id),
        batch.scores,
        tail,
        client.log,
        time.perf_counter() - started,
    )
    metrics = metrics.model_copy(
        update={"tokens_sampled": metrics.tokens_sampled - eval_tokens, "eval_before": eval_before}
    )
    if kl_sample_train is not None:  # the datums carry the current weights' logprobs
        metrics = metrics.model_copy(update={"kl_sample_train": kl_sample_train})
    evaluation = evaluate_after_cycle(  # {} unless due; after the numbers above are taken
        client, run_id, cycle, config.eval_every, config.cycles, plan.evaluation
    )
    return metrics.model_copy(
        update={
            "groups_resampled": batch.groups_resampled,
            "groups_dropped": batch.groups_dropped,
            "recipe_metrics": batch.recipe_metrics,
            "auxiliary_seq_end": seq_ends(auxiliary, client.ledger),
            "checkpoint": tail.checkpoint,
            "sampler_id": sampling.sampler_id,
            "staleness": staleness,
            "presampled": sampling.presampled_after(cycle, ctx.presampled),
            "episodes": batch.episodes,
            **evaluation,
        }
    )


def single_turn_batch(
    plan: RLPlan,
    ctx: CycleContext,
    sampling: CycleSamples,
    auxiliary: Sequence[AuxiliaryHandle],
    judge: JudgeHandle | None = None,
) -> TrainingBatch:
    """The cycle's training batch from its samples (`sample_cycle`); resampling samples on
    the same sampler; the judge's rewards when there is one."""
    prompts, requests = plan.sample_requests(ctx.cycle)
    sample = functools.partial(  # on the next seq ids, together or one by one: the same ids
        ctx.sampler_calls,
        sampling.sampler_id,
        "sample",
        together=plan.config.concurrent_sampling,
    )
    return build_training_batch(
        plan,
        ctx,
        sampling.sampler_id,
        prompts,
        requests,
        sampling.samples,
        sample,
        auxiliary,
        rewards=judge_rewards(plan, ctx.client, judge),
    )


def judge_rewards(
    plan: RLPlan, client: SequencedClient, judge: JudgeHandle | None
) -> GroupRewards | None:
    """The rewards of the cycle's judge (flows.rl.judge); None: the environment's."""
    if judge is None or plan.rubric is None:
        return None
    return Judge(judge, plan.rubric, client, plan.config.judge.concurrency).rewards


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
        learning_curves(result.cycles),
    )


@cycle_subflow("rl-cycle")
def rl_cycle(
    config: RLConfig,
    cycle: int,
    start: CycleStart,
    whitney_block: str | None = None,
    run_id: str = "",
    auxiliary: list[AuxiliaryHandle] | None = None,
    judge: JudgeHandle | None = None,
) -> CycleMetrics:
    """One RL cycle of the policy run `run_id` (and the recipe's `auxiliary` runs, and the
    `judge` run) from `start`; returns its metrics, with where the next cycle starts."""
    handles = auxiliary or []
    names = {run_id: "policy", **{handle.run_id: handle.name for handle in handles}}
    if judge is not None:
        names[judge.run_id] = "judge"
    plan = check_rl_config(config)  # built once per process (flows.core.loop.plans)
    ctx = CycleContext.open(config, cycle, start, whitney_block, run_id)
    return ctx.finish(run_cycle(plan, ctx, handles, judge), names)


@flow(name="rl", persist_result=False, **CLEANUP_HOOKS)
def rl_flow(config: RLConfig, whitney_block: str | None = None) -> RLResult:
    """Train a LoRA adapter by RL on Whitney: validate, open a labelled session and a run,
    run `config.cycles` cycle subflows, then save_state, export_lora, finish, close.

    Args:
        config: The RL configuration: environment, loss and its recipe, sampling, cycles.
        whitney_block: A saved WhitneyCredentials block to train on; empty: `api_url`
            (else WHITNEY_API_URL) with WHITNEY_API_KEY.
    """
    plan = check_rl_config(config)  # fails closed before anything is allocated
    connection = resolve_connection(config.api_url, whitney_block)
    guard = BudgetGuard(config.budget, flow_cost_model(config.prices, whitney_block))
    training = start_training_run(config, connection)
    start, run_id = training.start, training.run_id
    opened = open_auxiliary_runs(training, plan.recipe, start.checkpoints)
    judge, judge_starts = None, {}
    if plan.rubric is not None:
        judge, judge_seq = open_judge_run(training, plan.rubric.model, config.judge.cache_dir)
        judge_starts = {judge.run_id: judge_seq}
    ran = run_cycles(
        rl_cycle,
        config,
        range(start.first_cycle, config.cycles),
        {run_id: training.next_seq_id, **ledger_starts(opened), **judge_starts},
        whitney_block,
        guard=guard,
        lineage=training.lineage,
        run_id=run_id,
        auxiliary=opened,
        judge=judge,
    )
    last_cycle = ran.last.cycle if ran.last is not None else start.first_cycle - 1
    client = training.client(ran.seq_ids)
    save_auxiliary_checkpoints(client, opened, last_cycle)  # a critic's, beside the policy's
    others = [handle.run_id for handle in opened] + list(judge_starts)
    final = end_training_run(  # its save_state is a resume point
        training, client, cycle_name(last_cycle), others, ran.records.cycles
    )
    result = RLResult(
        **dict(final),
        cycles=ran.records.cycles,
        usage=guard.used,
        cost=guard.cost,
        budget_stop=guard.stopped,
    )
    add_summary(ran.records, result)
    return result
