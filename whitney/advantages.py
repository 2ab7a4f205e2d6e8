"""The advantage helpers of Whitney's Loop building blocks ("Advantage helpers"), to the letter."""

__all__ = [
    "all_zero",
    "group_mean_advantages",
    "kl_adjust_advantages",
    "leave_one_out_baseline",
    "length_normalize",
]


def group_mean_advantages(rewards: list[float], *, normalize_std: bool = False) -> list[float]:
    """Group-relative advantage: reward minus the group mean.

    Standard GRPO additionally divides by the group standard deviation
    (normalize_std=True); the no-std variant is the raw centered value.
    """
    if len(rewards) < 2:
        raise ValueError("group_mean_advantages needs at least two rewards to form a group")
    mean_reward = sum(rewards) / len(rewards)
    centered = [reward - mean_reward for reward in rewards]
    if not normalize_std:
        return centered
    variance = sum(value * value for value in centered) / len(centered)
    std = variance**0.5
    if std < 1e-6:
        return centered
    return [value / std for value in centered]


def all_zero(advantages: list[float]) -> bool:
    """True when a group produced zero gradient signal (uniform reward)."""
    return all(value == 0 for value in advantages)


def leave_one_out_baseline(rewards: list[float]) -> list[float]:
    """RLOO: each trajectory's advantage is its reward minus the mean of the
    other trajectories in its group."""
    count = len(rewards)
    if count < 2:
        raise ValueError("leave_one_out_baseline needs at least two rewards to form a group")
    total = sum(rewards)
    return [reward - (total - reward) / (count - 1) for reward in rewards]


def length_normalize(advantage: float, completion_length: int) -> float:
    """Scale a scalar advantage by 1 / len(completion)."""
    if completion_length <= 0:
        raise ValueError("completion_length must be positive")
    return advantage / completion_length


def kl_adjust_advantages(
    advantages: list[float],
    sampled_logprobs: list[float],
    reference_logprobs: list[float],
    *,
    kl_coef: float,
) -> list[float]:
    """Subtract a per-token KL-vs-reference penalty from per-token advantages.
    Used by REINFORCE++'s K2/reference-KL term — see reference_logprobs from
    a frozen second run in [Distillation](/distillation)."""
    return [
        advantage - kl_coef * (sampled_logprob - reference_logprob)
        for advantage, sampled_logprob, reference_logprob in zip(
            advantages, sampled_logprobs, reference_logprobs, strict=True
        )
    ]
