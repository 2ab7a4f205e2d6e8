"""LoRA on the seven projections of every layer, PEFT convention: delta W = B @ A * (alpha / r),
applied through the merged weights (see `model.LoraLinear` for its gradients)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from whitney.local.engine import exact
from whitney.local.engine.model import PROJECTIONS, ModelConfig, weight_shapes


class Lora:
    """Trainable A [r, in] and B [out, r] per projection (base weights stay frozen)."""

    def __init__(self, A: dict[str, Tensor], B: dict[str, Tensor], rank: int, alpha: float):
        self.A, self.B, self.rank, self.alpha = A, B, rank, alpha
        self.scale = alpha / rank

    @classmethod
    def init(cls, cfg: ModelConfig, rank: int, seed: int) -> Lora:
        """A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming-uniform, a=sqrt(5)) from `seed`; B = 0."""
        gen = torch.Generator().manual_seed(seed)
        A, B = {}, {}
        for name in target_names(cfg):
            out_features, in_features = weight_shapes(cfg)[name + ".weight"]
            bound = 1.0 / math.sqrt(in_features)
            A[name] = (torch.rand(rank, in_features, generator=gen) * 2 - 1) * bound
            B[name] = torch.zeros(out_features, rank)
        return cls(A, B, rank, alpha=2.0 * rank)

    def parameters(self) -> dict[str, Tensor]:
        """Every adapter tensor under a flat name: `<module>.lora_A` / `<module>.lora_B`."""
        params = {}
        for name in self.A:
            params[name + ".lora_A"] = self.A[name]
            params[name + ".lora_B"] = self.B[name]
        return params

    def requires_grad_(self) -> Lora:
        for t in self.parameters().values():
            t.requires_grad_(True)
        return self

    def adapter(self, name: str) -> tuple[Tensor, Tensor]:
        """(A, B) of projection `name`."""
        return self.A[name], self.B[name]

    def merged_weight(self, weight: Tensor, name: str) -> Tensor:
        """W + scale * B @ A, the product exact (see `exact`): trainer and sampler both use it."""
        bits = exact.bits_for(self.A[name].shape[0])
        delta = exact.matmul(
            exact.fixed_point(self.B[name], bits), exact.fixed_point(self.A[name].t(), bits)
        )
        return weight + delta * self.scale

    def snapshot(self) -> Lora:
        """A detached copy: later training does not change it."""
        return Lora(
            {n: a.detach().clone() for n, a in self.A.items()},
            {n: b.detach().clone() for n, b in self.B.items()},
            self.rank,
            self.alpha,
        )

    def merged(self, weights: dict[str, Tensor]) -> dict[str, Tensor]:
        """A sampling copy of the weights: W + scale * B @ A on the projections, the rest shared."""
        out = dict(weights)
        with torch.no_grad():
            for name in self.A:
                out[name + ".weight"] = self.merged_weight(weights[name + ".weight"], name)
        return out


def target_names(cfg: ModelConfig) -> list[str]:
    """Module names (HF, without `.weight`) that carry an adapter, in a fixed order."""
    return [f"model.layers.{n}.{p}" for n in range(cfg.num_layers) for p in PROJECTIONS]
