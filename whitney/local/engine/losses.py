"""The eight Whitney losses of docs/losses.md over right-padded [B, T] tensors: per-token terms
times w_t, summed (ppo_critic: a mean over datums), with the loss_config of
`validation.loss_config` (every key the loss reads, defaults filled in). Returns (loss,
metrics).

A datum's contribution is the float64 sum of its tokens' terms, left to right (so padding
changes nothing); the loss adds the contributions in datum order, in float64, and rounds once."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from whitney.local.engine.exact import exponential, prefix_sum

# loss_inputs padded to [B, T]: 0 past each datum's end, NaN where a datum lacks an optional tensor
Inputs = dict[str, Tensor]
Result = tuple[Tensor, dict[str, float]]


def wmean(x: Tensor, w: Tensor) -> float:
    """Weighted mean over all tokens (0 when no token has weight)."""
    total = w.sum()
    return float((x * w).sum() / total) if total > 0 else 0.0


def total(terms: Tensor) -> Tensor:
    """Sum of per-token terms [B, T]: each datum's tokens left to right, then datum by datum."""
    return prefix_sum(prefix_sum(terms, torch.float64)).float()


def ratio(lp: Tensor, q: Tensor) -> Tensor:
    return exponential((lp - q).clamp(-20.0, 20.0))


def given_or(inputs: Inputs, name: str, default: Tensor) -> Tensor:
    """A per-token input where the datum has it, else `default`."""
    given = inputs.get(name)
    return default if given is None else torch.where(given.isnan(), default, given)


def clip_bounds(inputs: Inputs, config: dict[str, float]) -> tuple[Tensor, Tensor]:
    """Per-token clip bounds: the per-token tensors where a datum has them, else loss_config."""
    shape = inputs["weights"].shape
    lo = torch.full(shape, config["clip_low_threshold"])
    hi = torch.full(shape, config["clip_high_threshold"])
    return given_or(inputs, "clip_low_threshold", lo), given_or(inputs, "clip_high_threshold", hi)


def base_metrics(loss: Tensor, lp: Tensor, inputs: Inputs) -> dict[str, float]:
    w = inputs["weights"]
    metrics = {"loss:sum": loss.item(), "tokens:sum": w.sum().item()}
    if "logprobs" in inputs:
        q = inputs["logprobs"]
        has_q = ~q.isnan()
        kl = torch.where(has_q, q - lp.detach(), 0.0)
        metrics["kl_sample_train:mean"] = wmean(kl, w * has_q)
    return metrics


def cross_entropy(lp: Tensor, inputs: Inputs, config: dict[str, float]) -> Result:
    loss = total(-lp * inputs["weights"])
    return loss, base_metrics(loss, lp, inputs)


def importance_sampling(lp: Tensor, inputs: Inputs, config: dict[str, float]) -> Result:
    r = ratio(lp, inputs["logprobs"])
    loss = total(-r * inputs["advantages"] * inputs["weights"])
    return loss, base_metrics(loss, lp, inputs)


def ppo(lp: Tensor, inputs: Inputs, config: dict[str, float]) -> Result:
    A, w = inputs["advantages"], inputs["weights"]
    lo, hi = clip_bounds(inputs, config)
    r = ratio(lp, inputs["logprobs"])
    loss = total(-torch.minimum(r * A, torch.clamp(r, lo, hi) * A) * w)
    clipped = ((r < lo) | (r > hi)).float()
    return loss, base_metrics(loss, lp, inputs) | {"clip_fraction:mean": wmean(clipped, w)}


def cispo(lp: Tensor, inputs: Inputs, config: dict[str, float]) -> Result:
    A, w = inputs["advantages"], inputs["weights"]
    lo, hi = clip_bounds(inputs, config)
    r = ratio(lp, inputs["logprobs"]).detach()
    loss = total(-torch.clamp(r, lo, hi) * A * lp * w)
    clipped = ((r < lo) | (r > hi)).float()
    return loss, base_metrics(loss, lp, inputs) | {"clip_fraction:mean": wmean(clipped, w)}


def dro(lp: Tensor, inputs: Inputs, config: dict[str, float]) -> Result:
    A, q, w = inputs["advantages"], inputs["logprobs"], inputs["weights"]
    beta = config["beta"]
    loss = total(-(lp * A - 0.5 * beta * (lp - q) ** 2) * w)
    return loss, base_metrics(loss, lp, inputs)


def gspo(lp: Tensor, inputs: Inputs, config: dict[str, float]) -> Result:
    """GSPO-token: the sequence ratio s (geometric mean of token ratios over the mask, log clamped
    to [-20, 20]) in value, each token's own ratio in gradient."""
    A, q, w = inputs["advantages"], inputs["logprobs"], inputs["weights"]
    lo, hi = clip_bounds(inputs, config)
    mask = given_or(inputs, "sequence_ratio_mask", (w != 0).float())
    log_s = prefix_sum((lp.detach() - q) * mask) / prefix_sum(mask).clamp(min=1.0)
    s = exponential(log_s.clamp(-20.0, 20.0)[:, None] + lp - lp.detach())
    loss = total(-torch.minimum(s * A, torch.clamp(s, lo, hi) * A) * w)
    clipped = ((s < lo) | (s > hi)).float()
    return loss, base_metrics(loss, lp, inputs) | {"clip_fraction:mean": wmean(clipped, w)}


def dppo(lp: Tensor, inputs: Inputs, config: dict[str, float]) -> Result:
    """Importance sampling with a binary total-variation trust region on p = exp(lp)."""
    A, q, w = inputs["advantages"], inputs["logprobs"], inputs["weights"]
    delta_low = config["delta_low"]
    delta_high = config["delta_high"]
    p, mu = exponential(lp.detach()), exponential(q)
    outside = ((A > 0) & (p - mu > delta_high)) | ((A < 0) & (mu - p > delta_low))
    m = (~outside).float()
    loss = total(-ratio(lp, q) * A * m * w)
    return loss, base_metrics(loss, lp, inputs) | {"masked_fraction:mean": wmean(1.0 - m, w)}


def ppo_critic(values: Tensor, inputs: Inputs, config: dict[str, float]) -> Result:
    """Clipped value loss: 0.5 * mean over datums of the weighted mean of max(clipped, plain)."""
    v_old, R, w = inputs["values"], inputs["returns"], inputs["weights"]
    c = config["value_clip"]
    v_clipped = v_old + torch.clamp(values - v_old, -c, c)
    err = torch.maximum((v_clipped - R) ** 2, (values - R) ** 2)
    sum_w = prefix_sum(w)
    per_datum = torch.where(sum_w > 0, prefix_sum(err * w) / sum_w.clamp(min=1e-30), 0.0)
    loss = 0.5 * prefix_sum(per_datum) / len(per_datum)
    clipped = ((values - v_old).abs() > c).float()
    metrics = {"loss:sum": loss.item(), "tokens:sum": w.sum().item()}
    return loss, metrics | {"values_clipfrac:mean": wmean(clipped, w)}


POLICY: dict[str, Callable[[Tensor, Inputs, dict[str, float]], Result]] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
    "dro": dro,
    "gspo": gspo,
    "dppo": dppo,
}
