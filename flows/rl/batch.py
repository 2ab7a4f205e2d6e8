"""A cycle's middle: from the sampled groups to the policy's forward_backward payload.

    rewards, advantages       per group: `score_group`
    dynamic resampling        uniform groups sampled again, then dropped:
                              `resample_uniform_groups`
    build_loss                per kept group, with the Loop building blocks' ctx plus the
                              recipe's extras
    finish_cycle              once, e.g. the critic's forward_backward and optim_step

Every call goes through the cycle's client, so its seq ids (on the policy and on each
auxiliary run) are allocated in a fixed order and a replayed cycle repeats them exactly.

Dynamic resampling: a group that teaches nothing is sampled again, up to a bound.

A group whose rewards are all equal has all-zero advantages (`all_zero`): its gradient is
zero, and it only dilutes the batch. With `resample_rounds` = k > 0, each round sends one more
`sample` request for every such group (the same prompt and parameters, a fresh seed derived
from (config seed, cycle, group index, round)), through the cycle's client on the policy's
sampler, so the calls take the next seq ids in a fixed order and a replayed cycle makes them
again identically. A group still uniform after k rounds is dropped from the loss. The cycle's
record counts the groups resampled and dropped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from flows.core.environments import Completion, Environment
from flows.core.loop.context import CycleContext
from flows.core.loop.plans import derive_seed
from flows.rl.auxiliary import AuxiliaryHandle
from flows.rl.metrics import EpisodeStats
from flows.rl.plan import RLPlan
from flows.rl.recipes import join_payloads
from flows.rl.recipes.context import LossContext
from whitney.advantages import all_zero, group_mean_advantages, leave_one_out_baseline
from whitney.datums import tensor
from whitney.renderers import Prompt, Renderer

ADVANTAGE_ESTIMATORS: dict[str, Callable[[list[float]], list[float]]] = {
    "grpo": functools.partial(group_mean_advantages, normalize_std=True),
    "grpo_no_std": group_mean_advantages,
    "rloo": leave_one_out_baseline,
}
"""The config's `advantages` choices, from the Loop building blocks' helpers."""


@dataclass(frozen=True)
class GroupScore:
    """A group's rewards and advantages, in the order of the sampled sequences."""

    rewards: list[float]
    advantages: list[float]

    @property
    def uniform(self) -> bool:
        """All rewards equal: the advantages are all zero, the group teaches nothing."""
        return max(self.rewards) == min(self.rewards)


def completions_of(renderer: Renderer, sample: dict[str, Any]) -> list[Completion]:
    """Each sequence of a sample as the renderer parses it (its text before the stop token)."""
    return [
        Completion(
            renderer.parse_response(sequence["tokens"])["content"],
            sequence["stop_reason"] == "stop",
        )
        for sequence in sample["sequences"]
    ]


def score_group(
    environment: Environment,
    renderer: Renderer,
    prompt: Prompt,
    sample: dict[str, Any],
    estimator: str,
) -> GroupScore:
    """Parse each sequence (its text before the stop token), reward it, and turn the rewards
    into advantages."""
    rewards = [
        float(environment.reward(prompt, completion))
        for completion in completions_of(renderer, sample)
    ]
    return GroupScore(rewards, ADVANTAGE_ESTIMATORS[estimator](rewards))


GroupRewards = Callable[[Sequence[tuple[Prompt, Sequence[Completion]]]], list[list[float]]]
"""The rewards of several groups at once, each a prompt and its completions (a judge's:
flows.rl.judge)."""


SampleGroups = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
"""Sample a list of requests in order (submitted together or one by one)."""
ScoreGroup = Callable[[Prompt, dict[str, Any]], GroupScore]
"""The score of a prompt's sample."""


@dataclass(frozen=True)
class Group:
    """A group as it goes to the loss: its latest sample and score, and its history."""

    index: int
    prompt: Prompt
    request: dict[str, Any]
    sample: dict[str, Any]
    score: GroupScore
    resamples: int = 0
    """Extra sample requests made for it."""
    dropped: bool = False
    """Still uniform after every round: left out of the loss."""


def uniform(score: GroupScore) -> bool:
    """No signal: equal rewards (whose centred advantages can be off zero by a rounding
    error), or advantages that are all zero."""
    return score.uniform or all_zero(score.advantages)


def resample_request(request: dict[str, Any], seed: int) -> dict[str, Any]:
    """The same SampleRequest with another sampling seed."""
    return {**request, "sampling_params": {**request["sampling_params"], "seed": seed}}


Redraw = Callable[[list[Group], int], list[Group]]
"""(the uniform groups, round number) -> those groups drawn again, in the same order."""


def resample_rounds(groups: Sequence[Group], rounds: int, redraw: Redraw) -> list[Group]:
    """The groups after up to `rounds` rounds of drawing the uniform ones again; those still
    uniform after the last round are marked dropped (none are when `rounds` is 0)."""
    current = list(groups)
    positions = {group.index: position for position, group in enumerate(current)}
    for round_number in range(1, rounds + 1):
        pending = [group for group in current if uniform(group.score)]
        if not pending:
            break
        for group in redraw(pending, round_number):
            current[positions[group.index]] = replace(group, resamples=group.resamples + 1)
    if rounds:
        current = [
            replace(group, dropped=True) if uniform(group.score) else group for group in current
        ]
    return current


def resample_uniform_groups(
    groups: Sequence[Group],
    rounds: int,
    sample_groups: SampleGroups,
    score_group: ScoreGroup,
    seed: int,
    cycle: int,
) -> list[Group]:
    """`resample_rounds` for single-turn groups: each round, one more sample request per
    uniform group, its seed from (config seed, cycle, group index, round)."""

    def redraw(pending: list[Group], round_number: int) -> list[Group]:
        requests = [
            resample_request(group.request, derive_seed(seed, cycle, group.index, round_number))
            for group in pending
        ]
        return [
            replace(group, request=request, sample=sample, score=score_group(group.prompt, sample))
            for group, request, sample in zip(
                pending, requests, sample_groups(requests), strict=True
            )
        ]

    return resample_rounds(groups, rounds, redraw)


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
    episodes: EpisodeStats | None = None
    """A multi-turn cycle's episodes and turns (flows.rl.multi_turn_batch)."""


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
    ctx: CycleContext,
    sampler_id: str,
    prompts: Sequence[Prompt],
    requests: Sequence[dict[str, Any]],
    samples: Sequence[dict[str, Any]],
    sample_groups: SampleGroups,
    auxiliary: Sequence[AuxiliaryHandle] = (),
    rewards: GroupRewards | None = None,
) -> TrainingBatch:
    """Score, resample, build every kept group's payload and finish the recipe's cycle
    (`recipe_payload`). `rewards`: the groups' rewards from elsewhere than the environment
    (a judge), the first draw's all at once.

    If every group is dropped, the first group's payload goes with all weights 0, so the
    cycle keeps its shape (forward_backward, optim_step) and trains nothing."""
    config = plan.config

    def scores(pairs: Sequence[tuple[Prompt, dict[str, Any]]]) -> list[GroupScore]:
        if rewards is None:
            return [
                score_group(plan.environment, plan.renderer, prompt, sample, config.advantages)
                for prompt, sample in pairs
            ]
        groups = [(prompt, completions_of(plan.renderer, sample)) for prompt, sample in pairs]
        estimator = ADVANTAGE_ESTIMATORS[config.advantages]
        return [GroupScore(values, estimator(values)) for values in rewards(groups)]

    def score(prompt: Prompt, sample: dict[str, Any]) -> GroupScore:
        return scores([(prompt, sample)])[0]

    first = [
        Group(index, prompt, request, sample, group_score)
        for index, (prompt, request, sample, group_score) in enumerate(
            zip(
                prompts,
                requests,
                samples,
                scores(list(zip(prompts, samples, strict=True))),
                strict=True,
            )
        )
    ]
    groups = resample_uniform_groups(
        first, config.resample_rounds, sample_groups, score, config.seed, ctx.cycle
    )
    kept = [group for group in groups if not group.dropped]
    calls = [
        LossCall(group.sample, group.request, group.score.rewards, group.score.advantages)
        for group in kept or groups[:1]
    ]
    payload, recipe_metrics = recipe_payload(
        plan, ctx, sampler_id, calls, auxiliary, train=bool(kept)
    )
    return TrainingBatch(
        payload=payload,
        scores=[group.score for group in first],
        groups_resampled=sum(group.resamples > 0 for group in groups),
        groups_dropped=sum(group.dropped for group in groups),
        recipe_metrics=recipe_metrics,
    )


@dataclass(frozen=True)
class LossCall:
    """One build_loss call: a sample of one prompt, its request, and the rewards and
    advantages of its sequences."""

    sample: dict[str, Any]
    request: dict[str, Any]
    rewards: list[float]
    advantages: list[float]


def recipe_payload(
    plan: RLPlan,
    ctx: CycleContext,
    sampler_id: str,
    calls: Sequence[LossCall],
    auxiliary: Sequence[AuxiliaryHandle] = (),
    *,
    train: bool = True,
) -> tuple[dict[str, Any], dict[str, float]]:
    """The recipe's build_loss on each call, in order, then its finish_cycle on all of them:
    their payloads joined into one (with every weight 0 unless `train`), and the recipe's
    metrics."""
    config = plan.config
    runs = {handle.name: handle for handle in auxiliary}
    scratch: dict[str, Any] = {}

    def context(rewards: list[float], advantages: list[float]) -> LossContext:
        return LossContext(
            client=ctx.client,
            run_id=ctx.run_id,
            sampler_id=sampler_id,
            provider=config.provider,
            loss_config=dict(config.loss_config),
            rewards=rewards,
            advantages=advantages,
            runs=runs,
            scratch=scratch,
        )

    payloads = [
        plan.recipe.build_loss(
            call.sample, ctx.cycle, call.request, context(call.rewards, call.advantages)
        )
        for call in calls
    ]
    payload = join_payloads(payloads)
    recipe_metrics: dict[str, float] = {}
    if plan.recipe.finish_cycle is not None:
        rewards = [reward for call in calls for reward in call.rewards]
        advantages = [value for call in calls for value in call.advantages]
        recipe_metrics = plan.recipe.finish_cycle(ctx.cycle, context(rewards, advantages))
    return (payload if train else zero_weights(payload)), dict(recipe_metrics)
