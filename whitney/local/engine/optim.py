"""AdamW with decoupled weight decay and bias correction, written out (torch.optim.AdamW's order
of operations), with global grad-norm clipping."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from whitney.errors import InvalidRequest

DEFAULTS = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-8,
    "weight_decay": 0.0,
    "grad_clip_norm": 0.0,
}


def hyperparameters(optimizer: dict) -> dict[str, float]:
    """The Optimizer payload with defaults filled in, validated."""
    if optimizer.get("type", "adamw") != "adamw":
        raise InvalidRequest(f"optimizer.type {optimizer.get('type')!r}: only adamw")
    hp = {}
    for key, default in DEFAULTS.items():
        value = optimizer.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise InvalidRequest(f"optimizer.{key} must be a finite number")
        hp[key] = float(value)
    if hp["learning_rate"] < 0 or hp["eps"] <= 0 or hp["grad_clip_norm"] < 0:
        raise InvalidRequest("optimizer: learning_rate, eps, grad_clip_norm < 0")
    if not (0 <= hp["beta1"] < 1 and 0 <= hp["beta2"] < 1):
        raise InvalidRequest("optimizer: beta1 and beta2 must be in [0, 1)")
    return hp


class AdamW:
    """Moments per named parameter; `t` counts the steps taken (for bias correction)."""

    def __init__(self, params: dict[str, Tensor]) -> None:
        self.params = params
        self.t = 0
        self.m = {n: torch.zeros_like(p) for n, p in params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in params.items()}

    def step(self, hp: dict[str, float]) -> float:
        """One update with validated hyperparameters from the accumulated grads (absent = zero);
        clears them; returns the pre-clip global grad norm."""
        lr, b1, b2, eps, wd = (
            hp[k] for k in ("learning_rate", "beta1", "beta2", "eps", "weight_decay")
        )
        grads = {
            n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in self.params.items()
        }
        norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])
        )
        if hp["grad_clip_norm"] > 0:
            coef = torch.clamp(hp["grad_clip_norm"] / (norm + 1e-6), max=1.0)
            grads = {n: g * coef for n, g in grads.items()}
        self.t += 1
        bias1, bias2 = 1 - b1**self.t, 1 - b2**self.t
        with torch.no_grad():
            for n, p in self.params.items():
                g, m, v = grads[n], self.m[n], self.v[n]
                p.mul_(1 - lr * wd)
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v.sqrt() / bias2**0.5).add_(eps)
                p.addcdiv_(m, denom, value=-lr / bias1)
                p.grad = None
        return float(norm)

    def state(self) -> dict[str, Tensor]:
        """Moments as flat tensors for safetensors (`t` is kept beside, in json)."""
        return {f"m.{n}": m for n, m in self.m.items()} | {f"v.{n}": v for n, v in self.v.items()}

    def load(self, tensors: dict[str, Tensor], t: int) -> None:
        for n in self.params:
            self.m[n].copy_(tensors[f"m.{n}"])
            self.v[n].copy_(tensors[f"v.{n}"])
        self.t = t
