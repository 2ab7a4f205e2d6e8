"""The training path's autograd functions give the bits of the gradient plain torch autograd
takes of the expressions they replace, written out here: the qkv split with RoPE
(`RotatedHeads`). Upstream gradients hold zeros of both signs where the parts' sums are -0
(autograd's zeros make them +0); compared as raw bits."""

from __future__ import annotations

import torch

from whitney.local.engine.kernels import same_bits
from whitney.local.engine.model import RotatedHeads


def split_and_rotate(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, h: int):
    """q, k, v [B, heads, T, d] by plain slices, with x * cos + rotate_half(x) * sin for q, k."""
    kv, half = (qkv.shape[2] - h) // 2, qkv.shape[-1] // 2
    x = qkv[:, :, : h + kv]
    qk = x * cos + torch.cat((x[..., half:], x[..., :half]), -1) * sin
    q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kv :]
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def signed_zeros(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """x with about a third of its elements +0 and a third -0."""
    pick = torch.rand(x.shape, generator=gen)
    return torch.where(pick < 0.33, 0.0, torch.where(pick < 0.66, -0.0, x))


def test_rotated_heads_give_the_bits_of_autograd_through_slices_and_rope() -> None:
    gen = torch.Generator().manual_seed(3)
    for h, kv, d in ((4, 4, 8), (9, 3, 64), (6, 2, 24)):
        qkv = torch.randn(2, 5, h + 2 * kv, d, generator=gen)
        cos, sin = (signed_zeros(torch.randn(2, 5, 1, d, generator=gen), gen) for _ in range(2))
        upstream = [signed_zeros(torch.randn(2, n, 5, d, generator=gen), gen) for n in (h, kv, kv)]
        leaf = qkv.clone().requires_grad_()
        want = split_and_rotate(leaf, cos, sin, h)
        want_grad = torch.autograd.grad(want, leaf, upstream)[0]
        fused = qkv.clone().requires_grad_()
        got = RotatedHeads.apply(fused, cos, sin, h)
        got_grad = torch.autograd.grad(got, fused, upstream)[0]
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape and a.stride() == b.stride() and same_bits(a, b)
        assert same_bits(got_grad, want_grad)
        g = torch.cat(upstream[:2], 1).transpose(1, 2)
        raw = g * cos + torch.cat(((g * sin)[..., d // 2 :], (g * sin)[..., : d // 2]), -1)
        assert (torch.signbit(raw) & (raw == 0)).any()  # the case autograd's zeros make +0
        assert not (torch.signbit(want_grad) & (want_grad == 0)).any()
