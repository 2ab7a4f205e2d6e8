"""Training on samples from older weights (max_staleness > 0): decoupled clipping.

A clipped loss (ppo, gspo, dppo, dro) keeps the new policy within a trust region around the
`logprobs` its datums carry. Around the sampler's weights, as on-policy, that region is off
centre once the sampler is a few steps old: the tokens the last steps already made likelier,
the rare rewarded ones first, sit outside it and teach nothing (measured: ppo at staleness 2
climbed to a reward of 0.20 in 30 cycles on `digits`, against 0.97 on-policy). So, as decoupled
PPO does (Hilton et al., 2021), the region is centred on the current weights (the proximal
policy) and the sampler's weights enter only as each token's importance weight:

    logprobs_t   <- log pi_current(token_t)          (a `logprobs` call on sampler `cycle-{n}`)
    advantage_t  <- advantage_t * min(pi_current / pi_sampler, BEHAVIOUR_WEIGHT_CAP)

With one optimizer step per batch the clip is then inactive where the gradient is taken, and
the update is the truncated importance-sampling one. `importance_sampling` (its ratio is the
full correction) and `cispo` (its clipped, detached ratio is a truncated importance weight)
already correct for the sampler as they are; `cross_entropy` has no ratio.

No Prefect, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

DECOUPLED_LOSSES = ("ppo", "gspo", "dppo", "dro")
"""The losses whose datums get decoupled clipping off-policy."""
BEHAVIOUR_WEIGHT_CAP = 5.0
"""The truncation of a token's importance weight pi_current / pi_sampler."""
SEQUENCES_PER_CALL = 64
"""Sequences per `logprobs` call of the current weights."""


def decouples(loss_function: str, staleness: int, proximal_clip: bool) -> bool:
    """Whether a cycle's payload of `loss_function` is decoupled."""
    return proximal_clip and staleness > 0 and loss_function in DECOUPLED_LOSSES


def datum_sequences(payload: dict[str, Any]) -> list[list[int]]:
    """Each datum's whole token sequence: its input and its last target."""
    return [
        [*datum["input"]["token_ids"], datum["loss_inputs"]["target_tokens"]["values"][-1]]
        for datum in payload["data"]
    ]


def logprobs_requests(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The `logprobs` payloads that score every datum's sequence, SEQUENCES_PER_CALL a call."""
    sequences = datum_sequences(payload)
    return [
        {
            "sequences": [
                {"token_ids": tokens} for tokens in sequences[start : start + SEQUENCES_PER_CALL]
            ]
        }
        for start in range(0, len(sequences), SEQUENCES_PER_CALL)
    ]


def decouple(
    payload: dict[str, Any], proximal: Sequence[Sequence[float | None]]
) -> tuple[dict[str, Any], float]:
    """The payload with each trained token's `logprobs` the current weights' and its
    advantage times its truncated importance weight; and the mean over trained tokens of
    (sampler - current) logprob, the cycle's `kl_sample_train`."""
    data, gaps = [], []
    for datum, current in zip(payload["data"], proximal, strict=True):
        inputs = datum["loss_inputs"]
        weights = inputs["weights"]["values"]
        behaviour = inputs["logprobs"]["values"]
        advantages = inputs["advantages"]["values"]
        new_logprobs, new_advantages = list(behaviour), list(advantages)
        for position, weight in enumerate(weights):
            if weight == 0:
                continue
            value = float(current[position + 1])  # current[0] is the first token's: None
            gap = behaviour[position] - value
            gaps.append(gap)
            new_logprobs[position] = value
            new_advantages[position] = advantages[position] * min(
                math.exp(-gap), BEHAVIOUR_WEIGHT_CAP
            )
        loss_inputs = {
            **inputs,
            "logprobs": {**inputs["logprobs"], "values": new_logprobs},
            "advantages": {**inputs["advantages"], "values": new_advantages},
        }
        data.append({**datum, "loss_inputs": loss_inputs})
    kl = sum(gaps) / len(gaps) if gaps else 0.0
    return {**payload, "data": data}, kl
