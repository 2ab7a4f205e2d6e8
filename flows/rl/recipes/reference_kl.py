"""REINFORCE++'s reference KL: a frozen reference run (`trainable: false`, the same base
model as the policy) answers `logprobs` for the sampled sequences through `ctx`, and each
token's advantage is lowered by `kl_coef * (sampled_lp - reference_lp)`
(`kl_adjust_advantages`), then built by the loss's own recipe.

It wraps any recipe with a `payload` builder (importance_sampling, ppo, cispo, dro, gspo,
dppo), selected by `reference_kl.enabled` in the config. With `length_normalize`, each
sequence's advantage is divided by its length first (`length_normalize`). The cycle's
`reference_kl` metric is the mean over sampled tokens of sampled_lp - reference_lp (the k1
estimate of KL(policy || reference)), whatever `kl_coef` is. On a multi-turn transcript the
penalty, the length and the metric count the sampled tokens only, not the observations.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flows.rl.config import ReferenceKLSettings
from flows.rl.recipes import AuxiliaryRun, Recipe, action_mask
from flows.rl.recipes.context import LossContext
from whitney.advantages import kl_adjust_advantages, length_normalize

REFERENCE = AuxiliaryRun(name="reference", trainable=False, sampler=True)
SCRATCH_KEY = "reference_kl"


def reference_logprobs(
    ctx: LossContext, prompt_tokens: list[int], sequences: list[dict[str, Any]]
) -> list[list[float]]:
    """The reference's logprob of each completion token, per sequence (one `logprobs`)."""
    reference = ctx.runs[REFERENCE.name]
    if reference.sampler_id is None:
        raise ValueError("the reference run has no sampler")
    request = {"sequences": [{"token_ids": prompt_tokens + s["tokens"]} for s in sequences]}
    result = ctx.client.sampler_operation(
        reference.run_id, reference.sampler_id, "logprobs", request
    )
    start = len(prompt_tokens)
    rows = result.get("logprobs") or []
    if len(rows) != len(sequences):
        raise ValueError(f"the reference answered {len(rows)} logprob rows for {len(sequences)}")
    return [[float(value) for value in row[start:]] for row in rows]


def build_loss(
    sample: dict[str, Any],
    cycle: int,
    request: dict[str, Any],
    ctx: LossContext,
    *,
    inner: Recipe,
    settings: ReferenceKLSettings,
) -> dict[str, Any]:
    """The inner recipe's payload on KL-adjusted per-token advantages."""
    assert inner.payload is not None
    prompt_tokens = request["prompt"]["token_ids"]
    sequences = sample["sequences"]
    totals = ctx.scratch.setdefault(SCRATCH_KEY, [0.0, 0])
    advantages: list[list[float]] = []
    for sequence, advantage, reference in zip(
        sequences,
        ctx.advantages,
        reference_logprobs(ctx, prompt_tokens, sequences),
        strict=True,
    ):
        sampled = [float(value) for value in sequence["logprobs"]]
        mask = action_mask(sequence)
        actions = int(sum(mask))
        if settings.length_normalize:
            advantage = length_normalize(advantage, actions)
        adjusted = kl_adjust_advantages(
            [advantage] * len(sampled), sampled, reference, kl_coef=settings.kl_coef
        )
        advantages.append([value * keep for value, keep in zip(adjusted, mask, strict=True)])
        pairs = zip(sampled, reference, mask, strict=True)
        totals[0] += sum(
            keep * (sampled_lp - reference_lp) for sampled_lp, reference_lp, keep in pairs
        )
        totals[1] += actions
    return inner.payload(prompt_tokens, sequences, advantages, ctx.loss_config, ctx.provider)


def finish_cycle(cycle: int, ctx: LossContext, *, inner: Recipe) -> dict[str, float]:
    """The cycle's mean KL to the reference, and the inner recipe's own metrics."""
    metrics = inner.finish_cycle(cycle, ctx) if inner.finish_cycle is not None else {}
    total, count = ctx.scratch.get(SCRATCH_KEY, (0.0, 0))
    if count:
        metrics = {**metrics, "reference_kl": total / count}
    return metrics


def with_reference_kl(inner: Recipe, settings: ReferenceKLSettings) -> Recipe:
    """`inner` with REINFORCE++'s reference KL; ValueError if it cannot take per-token
    advantages (no `payload` builder: cross_entropy, ppo_critic)."""
    if inner.payload is None:
        raise ValueError(
            f"the {inner.name} recipe cannot take the reference KL: it builds no payload from "
            "per-token advantages (use importance_sampling, ppo, cispo, dro, gspo or dppo)"
        )
    if any(run.name == REFERENCE.name for run in inner.auxiliary_runs):
        raise ValueError(f"the {inner.name} recipe has a reference run already")

    def wrapped_build_loss(
        sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
    ) -> dict[str, Any]:
        return build_loss(sample, cycle, request, ctx, inner=inner, settings=settings)

    def wrapped_finish_cycle(cycle: int, ctx: LossContext) -> dict[str, float]:
        return finish_cycle(cycle, ctx, inner=inner)

    return replace(
        inner,
        name=f"reference_kl+{inner.name}",
        build_loss=wrapped_build_loss,
        payload=None,
        auxiliary_runs=(*inner.auxiliary_runs, REFERENCE),
        finish_cycle=wrapped_finish_cycle,
    )
