"""A cycle's middle: from the sampled groups to the policy's forward_backward payload.

    rewards, advantages       per group (flows.rl.scoring)
    dynamic resampling        uniform groups sampled again, then dropped (flows.rl.resampling)
    build_loss                per kept group, with the page's ctx plus the recipe's extras
    finish_cycle              once, e.g. the critic's forward_backward and optim_step

Every call goes through the cycle's client, so its seq ids (on the policy and on each
auxiliary run) are allocated in a fixed order and a replayed cycle repeats them exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flows.core.sequenced_client import SequencedClient
from flows.rl.auxiliary import AuxiliaryHandle
from flows.rl.plan import RLPlan
from flows.rl.recipes import join_payloads
from flows.rl.recipes.context import LossContext
from flows.rl.resampling import Group, SampleGroups, resample_uniform_groups
from flows.rl.scoring import GroupScore, score_group
from whitney.datums import tensor


@dataclass(frozen=True)
class TrainingBatch:
    """The policy's payload, and what the cycle's record says about how it was made."""

    payload: dict[str, Any]
    scores: list[GroupScore]
    """Every group's first-draw score (the cycle's reward metrics describe the policy on its
    prompts, before resampling chose among draws)."""
    groups_resampled: int
    groups_dropped: int
    recipe_metrics: dict[str, float]


def zero_weights(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with every datum's weights set to 0: a valid forward_backward that
    trains nothing."""
    data = []
    for datum in payload["data"]:
        length = len(datum["input"]["token_ids"])
        loss_inputs = {**datum["loss_inputs"], "weights": tensor("float32", [0.0] * length)}
        data.append({**datum, "loss_inputs": loss_inputs})
    return {**payload, "data": data}


def build_training_batch(
    plan: RLPlan,
    client: SequencedClient,
    cycle: int,
    run_id: str,
    sampler_id: str,
    prompts: Sequence[str],
    requests: Sequence[dict[str, Any]],
    samples: Sequence[dict[str, Any]],
    sample_groups: SampleGroups,
    auxiliary: Sequence[AuxiliaryHandle] = (),
) -> TrainingBatch:
    """Score, resample, build every kept group's payload and finish the recipe's cycle.

    If every group is dropped, the first group's payload goes with all weights 0, so the
    cycle keeps its shape (forward_backward, optim_step) and trains nothing."""
    config = plan.config

    def score(prompt: str, sample: dict[str, Any]) -> GroupScore:
        return score_group(plan.environment, plan.tokenizer, prompt, sample, config.advantages)

    first = [
        Group(index, prompt, request, sample, score(prompt, sample))
        for index, (prompt, request, sample) in enumerate(
            zip(prompts, requests, samples, strict=True)
        )
    ]
    groups = resample_uniform_groups(
        first, config.resample_rounds, sample_groups, score, config.seed, cycle
    )
    runs = {handle.name: handle for handle in auxiliary}
    scratch: dict[str, Any] = {}

    def context(rewards: list[float], advantages: list[float]) -> LossContext:
        return LossContext(
            client=client,
            run_id=run_id,
            sampler_id=sampler_id,
            provider=config.provider,
            loss_config=dict(config.loss_config),
            rewards=rewards,
            advantages=advantages,
            runs=runs,
            scratch=scratch,
        )

    def build(group: Group) -> dict[str, Any]:
        ctx = context(group.score.rewards, group.score.advantages)
        return plan.recipe.build_loss(group.sample, cycle, group.request, ctx)

    kept = [group for group in groups if not group.dropped]
    payloads = [build(group) for group in kept] or [zero_weights(build(groups[0]))]
    trained = kept or groups[:1]
    recipe_metrics: dict[str, float] = {}
    if plan.recipe.finish_cycle is not None:
        rewards = [reward for group in trained for reward in group.score.rewards]
        advantages = [value for group in trained for value in group.score.advantages]
        recipe_metrics = plan.recipe.finish_cycle(cycle, context(rewards, advantages))
    return TrainingBatch(
        payload=join_payloads(payloads),
        scores=[group.score for group in first],
        groups_resampled=sum(group.resamples > 0 for group in groups),
        groups_dropped=sum(group.dropped for group in groups),
        recipe_metrics=dict(recipe_metrics),
    )
