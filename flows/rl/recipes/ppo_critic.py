"""PPO with a critic (loss `ppo_critic`): a second run, `role: "critic"`, learns the value of
each completion prefix, and the policy trains with `ppo` on GAE advantages.

Per group, through `ctx.client`:

1. the critic's `forward` on the sampled sequences: `values` V_old for every position (a
   critic's forward needs `values` and `returns` inputs; zeros, as nothing is trained);
2. GAE over each completion: the group's reward on its last token, `gamma`, `gae_lambda`,
   V = 0 after the end; returns = advantages + V_old;
3. the policy's payload: `ppo` datums with per-token advantages (whitened over the group's
   tokens unless told not to), the clip range as scalar loss_config keys.

Once per cycle, after every group (`finish_cycle`): the critic's `forward_backward` with
`ppo_critic` on every group's (V_old, returns), then its `optim_step`. Its loss, taken before
that update on the cycle's fresh samples, is the cycle's `value_loss`. Critic runs exist on
modal and local only.

On a multi-turn transcript, GAE runs over the sampled tokens in order (an observation is part
of the step from one action to the next), and the critic trains on their positions only.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from flows.rl.config import CriticSettings
from flows.rl.recipes import AuxiliaryRun, ClipRange, Recipe, action_mask, clipped_payload
from flows.rl.recipes.context import LossContext
from whitney.datums import Datum, tensor
from whitney.payloads import adamw_optimizer, forward_backward_payload

POLICY_LOSS = "ppo"
CRITIC_LOSS = "ppo_critic"
CRITIC = AuxiliaryRun(name="critic", role="critic")
SCRATCH_KEY = "critic_data"


class PPOCriticSettings(ClipRange):
    """loss_config of PPO with a critic: the policy's ratio bounds and the critic's clip."""

    clip_low_threshold: float = Field(default=0.8, ge=0, description="Lower ratio bound")
    clip_high_threshold: float = Field(default=1.2, gt=0, description="Upper ratio bound")
    value_clip: float = Field(default=0.2, gt=0, description="The critic's value clip")


def gae(
    reward: float, values: Sequence[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """GAE advantages and returns of one completion: `reward` on its last token, 0 before;
    `values[j]` the critic's value before token j; the value after the end is 0."""
    length = len(values)
    advantages = [0.0] * length
    running = 0.0
    for j in reversed(range(length)):
        next_value = values[j + 1] if j + 1 < length else 0.0
        step_reward = reward if j == length - 1 else 0.0
        delta = step_reward + gamma * next_value - values[j]
        running = delta + gamma * lam * running
        advantages[j] = running
    returns = [advantage + value for advantage, value in zip(advantages, values, strict=True)]
    return advantages, returns


def action_gae(
    reward: float, values: Sequence[float], mask: Sequence[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """`gae` over the sampled tokens of a completion (mask 1.0), in order; 0.0 at its
    observation tokens."""
    actions = [index for index, keep in enumerate(mask) if keep]
    advantages, returns = gae(reward, [values[index] for index in actions], gamma, lam)
    full_advantages, full_returns = [0.0] * len(mask), [0.0] * len(mask)
    for index, advantage, value in zip(actions, advantages, returns, strict=True):
        full_advantages[index], full_returns[index] = advantage, value
    return full_advantages, full_returns


def whiten(
    per_sequence: list[list[float]], masks: list[list[float]] | None = None
) -> list[list[float]]:
    """Every sampled token's value (`masks`: 1.0 where sampled, default everywhere) minus the
    mean over all sampled tokens, over their std (centred only when the std is ~0); 0.0 at
    observation tokens."""
    if masks is None:
        masks = [[1.0] * len(values) for values in per_sequence]
    flat = [
        value
        for values, mask in zip(per_sequence, masks, strict=True)
        for value, keep in zip(values, mask, strict=True)
        if keep
    ]
    mean = statistics.fmean(flat)
    std = statistics.pstdev(flat)
    scale = 1.0 / std if std > 1e-6 else 1.0
    return [
        [(value - mean) * scale * keep for value, keep in zip(values, mask, strict=True)]
        for values, mask in zip(per_sequence, masks, strict=True)
    ]


def critic_datum(
    prompt_tokens: list[int],
    tokens: list[int],
    values: list[float],
    returns: list[float],
    mask: list[float] | None = None,
) -> Datum:
    """A ppo_critic datum: right-shifted input, weights 1 on the completion's sampled
    positions (`mask`, default all); `values` / `returns` over every position (the others
    are ignored: weight 0)."""
    full = list(prompt_tokens) + list(tokens)
    pad = len(prompt_tokens) - 1
    return {
        "input": {"token_ids": full[:-1]},
        "loss_inputs": {
            "weights": tensor("float32", [0.0] * pad + (mask or [1.0] * len(tokens))),
            "values": tensor("float32", [float(value) for value in values]),
            "returns": tensor("float32", [float(value) for value in returns]),
        },
    }


def critic_values(
    ctx: LossContext, settings: PPOCriticSettings, prompt_tokens: list[int], sequences: list[dict]
) -> list[list[float]]:
    """The critic's values at every position of each sequence's datum (one `forward`)."""
    probes = []
    for sequence in sequences:
        length = len(prompt_tokens) + len(sequence["tokens"]) - 1
        probes.append(
            critic_datum(prompt_tokens, sequence["tokens"], [0.0] * length, [0.0] * length)
        )
    payload = forward_backward_payload(probes, CRITIC_LOSS, {"value_clip": settings.value_clip})
    result = ctx.client.run_operation(ctx.runs[CRITIC.name].run_id, "forward", payload)
    outputs = result.get("outputs") or []
    if len(outputs) != len(sequences):
        raise ValueError(
            f"the critic's forward returned {len(outputs)} outputs for {len(sequences)}"
        )
    return [[float(value) for value in output["values"]] for output in outputs]


def build_loss(
    sample: dict[str, Any],
    cycle: int,
    request: dict[str, Any],
    ctx: LossContext,
    *,
    options: CriticSettings | None = None,
) -> dict[str, Any]:
    """The policy's ppo payload on GAE advantages; the critic's datums go to ctx.scratch."""
    options = options or CriticSettings()
    settings = PPOCriticSettings.model_validate(dict(ctx.loss_config))
    prompt_tokens = request["prompt"]["token_ids"]
    sequences = sample["sequences"]
    pad = len(prompt_tokens) - 1
    advantages: list[list[float]] = []
    masks = [action_mask(sequence) for sequence in sequences]
    critic_data = ctx.scratch.setdefault(SCRATCH_KEY, [])
    for sequence, mask, reward, values in zip(
        sequences,
        masks,
        ctx.rewards,
        critic_values(ctx, settings, prompt_tokens, sequences),
        strict=True,
    ):
        completion_values = values[pad : pad + len(sequence["tokens"])]
        sequence_advantages, returns = action_gae(
            reward, completion_values, mask, options.gamma, options.gae_lambda
        )
        advantages.append(sequence_advantages)
        critic_data.append(
            critic_datum(prompt_tokens, sequence["tokens"], values, [0.0] * pad + returns, mask)
        )
    if options.normalize_advantages:
        advantages = whiten(advantages, masks)
    policy_clip = ClipRange(
        clip_low_threshold=settings.clip_low_threshold,
        clip_high_threshold=settings.clip_high_threshold,
    )
    return clipped_payload(
        POLICY_LOSS, policy_clip, prompt_tokens, sequences, advantages, ctx.provider
    )


def finish_cycle(
    cycle: int, ctx: LossContext, *, options: CriticSettings | None = None
) -> dict[str, float]:
    """Train the critic on the cycle's (V_old, returns): forward_backward, optim_step."""
    options = options or CriticSettings()
    data = ctx.scratch.get(SCRATCH_KEY)
    if not data:
        return {}
    settings = PPOCriticSettings.model_validate(dict(ctx.loss_config))
    critic = ctx.runs[CRITIC.name].run_id
    payload = forward_backward_payload(data, CRITIC_LOSS, {"value_clip": settings.value_clip})
    backward = ctx.client.run_operation(critic, "forward_backward", payload)
    optimizer = adamw_optimizer(options.learning_rate, grad_clip_norm=options.grad_clip_norm)
    optimized = ctx.client.run_operation(critic, "optim_step", {"optimizer": optimizer})
    metrics = backward.get("metrics") or {}
    return {
        "value_loss": float(backward.get("loss", 0.0)),
        "values_clipfrac": float(metrics.get("values_clipfrac:mean", 0.0)),
        "critic_grad_norm": float((optimized.get("metrics") or {}).get("grad_norm", 0.0)),
    }


RECIPE = Recipe(
    name="ppo_critic",
    loss_function=POLICY_LOSS,
    build_loss=build_loss,
    loss_settings=PPOCriticSettings,
    auxiliary_runs=(CRITIC,),
    finish_cycle=finish_cycle,
    options="critic",
)
