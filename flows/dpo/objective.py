"""The DPO objective as the flow computes it, in plain Python (no torch, no Prefect).

For a pair i with the policy's summed completion logprobs `pc_i`, `pr_i` (chosen, rejected)
and the frozen reference's `rc_i`, `rr_i`, the margin is

    m_i = beta * ((pc_i - rc_i) - (pr_i - rr_i))

and the loss of a batch of N pairs, with label smoothing e (the conservative DPO of
Mitchell 2023, e = 0: plain DPO), plus `sft_weight` times the chosen answers' mean NLL per
token:

    L = 1/N sum_i [ -(1 - e) log sigmoid(m_i) - e log sigmoid(-m_i) ]
        + sft_weight / N * sum_i ( -pc_i / len(chosen_i) )

dL/dpc_i = -w_i - sft_weight / (N len(chosen_i)) and dL/dpr_i = +w_i with the per-pair weight

    w_i = beta / N * ( (1 - e) sigmoid(-m_i) - e sigmoid(m_i) )

(`beta * sigmoid(-m_i) / N` without smoothing). `importance_sampling` at ratio 1 has the loss
gradient `-sum_t A_t grad lp_t`, so the advantages `+w_i + sft_weight / (N len(chosen_i))` on
every chosen token and `-w_i` on every rejected token make its gradient exactly dL.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PairLogprobs:
    """One pair's summed completion logprobs under the policy and the reference."""

    policy_chosen: float
    policy_rejected: float
    reference_chosen: float
    reference_rejected: float

    @property
    def chosen_drift(self) -> float:
        """How far the policy moved the chosen answer's logprob from the reference's."""
        return self.policy_chosen - self.reference_chosen

    @property
    def rejected_drift(self) -> float:
        return self.policy_rejected - self.reference_rejected


def log_sigmoid(x: float) -> float:
    """log(1 / (1 + exp(-x))), without overflow."""
    if x >= 0:
        return -math.log1p(math.exp(-x))
    return x - math.log1p(math.exp(x))


def sigmoid(x: float) -> float:
    return math.exp(log_sigmoid(x))


def margin(pair: PairLogprobs, beta: float) -> float:
    """beta * ((policy - reference) on the chosen answer - the same on the rejected one)."""
    return beta * (pair.chosen_drift - pair.rejected_drift)


def pair_loss(pair_margin: float, label_smoothing: float) -> float:
    """-(1 - e) log sigmoid(m) - e log sigmoid(-m)."""
    return -(1 - label_smoothing) * log_sigmoid(pair_margin) - label_smoothing * log_sigmoid(
        -pair_margin
    )


def pair_weight(pair_margin: float, beta: float, label_smoothing: float, pairs: int) -> float:
    """-dL/dpc of one pair in a batch of `pairs`: beta / N ((1 - e) sigmoid(-m) - e sigmoid(m))."""
    pull = (1 - label_smoothing) * sigmoid(-pair_margin) - label_smoothing * sigmoid(pair_margin)
    return beta * pull / pairs


def pair_advantages(
    pair_margin: float,
    chosen_tokens: int,
    rejected_tokens: int,
    *,
    beta: float,
    label_smoothing: float,
    sft_weight: float,
    pairs: int,
) -> tuple[list[float], list[float]]:
    """The per-token advantages of a pair's chosen and rejected completion (see the module
    docstring): +weight (+ the SFT share) on each chosen token, -weight on each rejected one."""
    weight = pair_weight(pair_margin, beta, label_smoothing, pairs)
    chosen = weight + sft_weight / (pairs * chosen_tokens)
    return [chosen] * chosen_tokens, [-weight] * rejected_tokens


@dataclass(frozen=True)
class PreferenceStats:
    """The DPO numbers of a set of pairs: the mean loss (without the SFT term), the share of
    pairs whose margin is positive, the share whose chosen answer the policy itself finds more
    likely than the rejected one (no reference), the mean margin and rewards (beta * drift),
    and the mean drift of the chosen and rejected logprobs from the reference's."""

    loss: float
    accuracy: float
    chosen_preferred: float
    margin: float
    chosen_reward: float
    rejected_reward: float
    chosen_drift: float
    rejected_drift: float
    pairs: int


def preference_stats(
    pairs: Sequence[PairLogprobs], beta: float, label_smoothing: float
) -> PreferenceStats:
    """The DPO numbers of `pairs` (at least one)."""
    if not pairs:
        raise ValueError("preference_stats needs at least one pair")
    margins = [margin(pair, beta) for pair in pairs]
    return PreferenceStats(
        loss=statistics.fmean(pair_loss(m, label_smoothing) for m in margins),
        accuracy=sum(m > 0 for m in margins) / len(margins),
        chosen_preferred=sum(p.policy_chosen > p.policy_rejected for p in pairs) / len(pairs),
        margin=statistics.fmean(margins),
        chosen_reward=statistics.fmean(beta * pair.chosen_drift for pair in pairs),
        rejected_reward=statistics.fmean(beta * pair.rejected_drift for pair in pairs),
        chosen_drift=statistics.fmean(pair.chosen_drift for pair in pairs),
        rejected_drift=statistics.fmean(pair.rejected_drift for pair in pairs),
        pairs=len(pairs),
    )
