"""The training path's autograd functions give the bits of the gradient plain torch autograd
takes of the expressions they replace, written out here: the qkv split with RoPE
(`RotatedHeads`) and RMSNorm (`RMSNorm`, after a residual's gradient, as in a layer). Upstream
gradients hold zeros of both signs (for RoPE where the parts' sums are -0, which autograd's
zeros make +0), RMSNorm's rows subnormals and zeros; compared as raw bits."""

from __future__ import annotations

import pytest
import torch

from whitney.local.engine import exact, model
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


def soft_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The engine's RMSNorm before `RMSNorm`: the exact value, the float mean square's gradient."""
    mean_square = exact.mean_square(x)
    soft = x.pow(2).mean(-1, keepdim=True)
    mean_square = mean_square + (soft - soft.detach())
    return weight * (x / exact.square_root(mean_square + eps))


def rms_rows(gen: torch.Generator, hidden: int) -> torch.Tensor:
    """Rows [2, 5, hidden]: random, a row of tiny elements with subnormals, one with zeros."""
    x = torch.randn(2, 5, hidden, generator=gen) * 3
    x[0, 1] *= 2.0**-60
    x[0, 2, ::3] = 2.0**-140  # subnormal
    x[0, 2, 1::3] = -0.0
    x[1, 3, ::2] = 0.0
    return x


def test_rms_norm_gives_the_bits_of_autograd_through_the_soft_mean_square() -> None:
    """x's gradient with a residual's (x's first): the three added in autograd's order."""
    gen = torch.Generator().manual_seed(4)
    for hidden in (576, 64, 7):
        x, weight = rms_rows(gen, hidden), torch.rand(hidden, generator=gen) + 0.5
        upstream = signed_zeros(torch.randn(2, 5, hidden, generator=gen), gen)
        residual = signed_zeros(torch.randn(2, 5, hidden, generator=gen), gen)
        grads = []
        for norm in (soft_rms_norm, model.rms_norm):
            leaf = x.clone().requires_grad_()
            inner = leaf.view_as(leaf)  # one node that gathers the residual's and the norm's
            y = inner + norm(inner, weight, 1e-5) * upstream
            grads.append((y.detach(), torch.autograd.grad(y, leaf, residual)[0]))
        (want, want_grad), (got, got_grad) = grads
        assert same_bits(got, want) and same_bits(got_grad, want_grad)


def test_rms_norm_refuses_a_weight_that_trains() -> None:
    """RMSNorm's backward gives no weight gradient: a weight that needs one is an error, not a 0."""
    weight = torch.ones(8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="weight is constant"):
        model.rms_norm(torch.randn(2, 8, requires_grad=True), weight, 1e-5)
