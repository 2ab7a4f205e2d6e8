"""AdamW with decoupled weight decay and bias correction, written out (torch.optim.AdamW's order
of operations, the root of v correctly rounded: `exact.square_root`), with global grad-norm
clipping."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from whitney.local.engine import exact


@dataclass(frozen=True)
class Saved:
    """Copies of what a step changes: parameters, moments, gradients and `t`."""

    params: dict[str, Tensor]
    m: dict[str, Tensor]
    v: dict[str, Tensor]
    grads: dict[str, Tensor | None]
    t: int


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
                denom = (exact.square_root(v) / bias2**0.5).add_(eps)
                p.addcdiv_(m, denom, value=-lr / bias1)
                p.grad = None
        return float(norm)

    def saved(self) -> Saved:
        """What `restore` needs to undo the next step."""
        return Saved(
            {n: p.detach().clone() for n, p in self.params.items()},
            {n: m.clone() for n, m in self.m.items()},
            {n: v.clone() for n, v in self.v.items()},
            {n: None if p.grad is None else p.grad.clone() for n, p in self.params.items()},
            self.t,
        )

    def restore(self, saved: Saved) -> None:
        """Parameters (in place), moments, gradients and `t` as `saved` holds them."""
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(saved.params[n])
                p.grad = saved.grads[n]
                self.m[n].copy_(saved.m[n])
                self.v[n].copy_(saved.v[n])
        self.t = saved.t

    def finite(self) -> bool:
        """Every parameter and moment is finite."""
        tensors = [*self.params.values(), *self.m.values(), *self.v.values()]
        return all(bool(torch.isfinite(t).all()) for t in tensors)

    def state(self) -> dict[str, Tensor]:
        """Moments as flat tensors for safetensors (`t` is kept beside, in json)."""
        return {f"m.{n}": m for n, m in self.m.items()} | {f"v.{n}": v for n, v in self.v.items()}

    def load(self, tensors: dict[str, Tensor], t: int) -> None:
        for n in self.params:
            self.m[n].copy_(tensors[f"m.{n}"])
            self.v[n].copy_(tensors[f"v.{n}"])
        self.t = t
