"""One RL cycle (the `rl-cycle` subflow): on its cycle context (flows.core.loop.context), the
sampler, the samples, the cycle's middle (flows.rl.batch, or flows.rl.multi_turn_batch), the
tail, the cycle's record. The flow around the cycles is flows.rl.flow."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from flows.core.config import checkpoint_due
from flows.core.evaluation.sampler import evaluate_after_cycle, evaluate_at_start
from flows.core.loop.context import CycleContext, CycleTail, sampler_calls
from flows.core.loop.cycles import CycleStart, cycle_subflow
from flows.core.loop.off_policy_schedule import CycleSamples, Schedule, sample_ahead
from flows.rl.auxiliary import (
    AuxiliaryHandle,
    save_auxiliary_checkpoints,
    seq_ends,
)
from flows.rl.batch import GroupRewards, GroupScore, TrainingBatch, build_training_batch
from flows.rl.config import RLConfig
from flows.rl.judge import Judge, JudgeHandle
from flows.rl.metrics import CycleMetrics
from flows.rl.multi_turn_batch import build_episode_batch
from flows.rl.off_policy import decouple, decouples, logprobs_requests
from flows.rl.plan import RLPlan, check_rl_config
from tasks.names import cycle_name
from tasks.operations import Call, OperationLog, SequencedClient
from whitney.payloads import adamw_optimizer


def cycle_metrics(
    shared: dict[str, Any], scores: list[GroupScore], tail: CycleTail, log: OperationLog
) -> CycleMetrics:
    """The cycle's record from the fields every cycle has (`CycleClock.fields`), its scores,
    its training tail and its operation log."""
    rewards = [reward for score in scores for reward in score.rewards]
    return CycleMetrics(
        **shared,
        reward_mean=statistics.fmean(rewards),
        reward_std=statistics.pstdev(rewards),
        all_zero_group_share=sum(score.uniform for score in scores) / len(scores),
        loss=tail.backward.loss,
        grad_norm=tail.optimized.metrics.get("grad_norm", 0.0),
        kl_sample_train=tail.backward.metrics.get("kl_sample_train:mean"),
        tokens_sampled=log.tokens("sample", "sampled_tokens"),
        tokens_trained=log.tokens("forward_backward", "trained_tokens"),
        usage={kind: dict(counters) for kind, counters in log.usage.items()},
    )


def sample_cycle(
    plan: RLPlan, ctx: CycleContext, sampler_id: str, schedule: Schedule
) -> CycleSamples:
    """The cycle's samples. On-policy (max_staleness 0): its own requests on `sampler_id`,
    together or one by one. Off-policy: `flows.core.loop.off_policy_schedule.sample_ahead`."""
    config = plan.config
    if config.max_staleness == 0:
        requests = plan.sample_requests(ctx.cycle)[1]
        samples = sampler_calls(
            ctx.client, ctx.run_id, sampler_id, "sample", requests, config.concurrent_sampling
        )
        return CycleSamples(sampler_id, samples, [])
    return sample_ahead(ctx, sampler_id, schedule, lambda later: plan.sample_requests(later)[1])


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
    clock = ctx.clock()
    config = plan.config
    client, cycle, run_id, first_cycle = ctx.client, ctx.cycle, ctx.run_id, ctx.first_cycle
    eval_before = None
    if config.eval_at_start and cycle == 0 and plan.evaluation is not None:
        eval_before = evaluate_at_start(ctx, plan.evaluation)
    eval_tokens = client.log.tokens("sample", "sampled_tokens")  # not the cycle's own
    clock = replace(clock, started=time.perf_counter())  # the wall time: the cycle's own work
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
    metrics = cycle_metrics(clock.fields(ctx), batch.scores, tail, client.log)
    metrics = metrics.model_copy(
        update={"tokens_sampled": metrics.tokens_sampled - eval_tokens, "eval_before": eval_before}
    )
    if kl_sample_train is not None:  # the datums carry the current weights' logprobs
        metrics = metrics.model_copy(update={"kl_sample_train": kl_sample_train})
    evaluation = evaluate_after_cycle(  # {} unless due; after the numbers above are taken
        ctx, config.eval_every, config.cycles, plan.evaluation
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
        sampler_calls,
        ctx.client,
        ctx.run_id,
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
