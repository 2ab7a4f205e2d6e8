"""The kernels that fuse a layer's exact elementwise work without gradients give the bits of the
unfused sequence the gradient path runs (the same operations in the same order): silu(gate) * up
and the down projection's rows, RoPE with the queries' fixed-point rows and the stored keys and
values, the residual add with RMSNorm and its product's activation rows; silu of the gate half
read in place gives `silu`'s bits; and with gradients, `Gated` gives the value and gradient of
autograd through the unfused silu(gate) * up. Random rows, a flat row, a row of tiny elements,
grouped-query heads; compared as raw bits (each kernel runs eagerly or compiled, whichever is
loaded: the two are checked against each other at load)."""

from __future__ import annotations

import math

import torch

from whitney.local.engine import exact
from whitney.local.engine.kernels import same_bits
from whitney.local.engine.model import (
    QUERIES_KEY_VALUES,
    Gated,
    KeyValues,
    gate_silu,
    gated_rows,
    norm_rows,
    rms_norm,
    rope,
    silu,
)


def rows(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 4
    x[..., 0, :] = 0.75  # a flat row
    x[..., 1, :] *= 2.0**-70
    return x


def test_gated_rows_are_the_activation_rows_of_silu_gate_times_up() -> None:
    for i in (512, 1536, 160):
        gate_up = rows(i, (2, 5, 2 * i))
        gate, up = gate_up.chunk(2, dim=-1)
        with torch.no_grad():
            want = exact.activation_rows(silu(gate) * up, exact.weight_bits(i))
            assert same_bits(gated_rows(silu(gate), gate_up), want)


def test_gated_is_silu_gate_times_up_with_autograds_gradient() -> None:
    """The gradient path's `Gated`: the value and the gradient autograd takes of the unfused
    expression (silu run again in its backward, the halves' gradients concatenated)."""
    for i in (512, 1536, 160, 37):
        gate_up = rows(i, (2, 5, 2 * i))
        upstream = torch.randn(2, 5, i, generator=torch.Generator().manual_seed(i))
        leaf = gate_up.clone().requires_grad_()
        gate, up = leaf.chunk(2, dim=-1)
        want = silu(gate) * up
        (want_grad,) = torch.autograd.grad(want, leaf, upstream)
        fused = gate_up.clone().requires_grad_()
        got = Gated.apply(fused)
        (got_grad,) = torch.autograd.grad(got, fused, upstream)
        assert same_bits(got.detach(), want.detach())
        assert same_bits(got_grad, want_grad)


def test_queries_key_values_are_rope_fixed_point_and_key_values() -> None:
    gen = torch.Generator().manual_seed(5)
    for heads, kv, d in ((4, 4, 32), (9, 3, 64), (6, 2, 24)):
        batch, length = 3, 6
        qkv = torch.randn(batch, length, heads + 2 * kv, d, generator=gen) * 3
        angles = torch.rand(batch, length, 1, d, generator=gen) * 20
        cos, sin = angles.cos(), angles.sin()
        grid = exact.pow2(torch.randint(-14, -6, (kv, 1, d), generator=gen))
        unit = exact.power(exact.bits_for(d))
        with torch.no_grad():
            qk = rope(qkv[:, :, : heads + kv], cos, sin)
            q, k = qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2)
            v = qkv[:, :, heads + kv :].transpose(1, 2)
            want_q = exact.fixed_point(q, exact.bits_for(d))
            want_kv = KeyValues.of(k, v, grid).data
            shaped = qkv.view(batch, length, heads // kv + 2, kv, d)
            fq, stored = QUERIES_KEY_VALUES(shaped, cos[:, :, None], sin[:, :, None], unit, grid)
            assert same_bits(fq, want_q)
            assert same_bits(stored, want_kv)


def test_gate_silu_is_silu_of_the_gate_half() -> None:
    """In place (I a multiple of 64, rows in several slices) and copied (I = 160, 37)."""
    for i in (1536, 512, 64, 160, 37):
        for batch in (1, 2, 30):
            gate_up = rows(i + batch, (batch, 5, 2 * i))
            with torch.no_grad():
                assert same_bits(gate_silu(gate_up), silu(gate_up.chunk(2, dim=-1)[0]))


def test_norm_rows_are_the_residual_rms_norm_and_its_activation_rows() -> None:
    for k, eps in ((576, 1e-5), (128, 1e-6), (70, 1e-5)):
        x, delta = rows(k, (3, 4, k)), rows(k + 1, (3, 4, k))
        weight = torch.rand(k, generator=torch.Generator().manual_seed(k)) + 0.5
        with torch.no_grad():
            total = x + delta
            want = exact.activation_rows(rms_norm(total, weight, eps), exact.weight_bits(k))
            got_total, got = norm_rows(x, weight, eps, delta)
            assert same_bits(got_total, total)
            assert same_bits(got, want)
            assert same_bits(norm_rows(total, weight, eps)[1], want)


def test_log_normaliser_is_the_exact_sum_of_the_shifted_rows_exps() -> None:
    """The row's max, and the log of the exact sum of exp(x - max) fused into one kernel
    (`exact.LOG_SHIFTED_TOTAL`): the bits of the unfused operations (the shift in float32,
    widened, each term on the grid 2**-(52 - log2 V)), and torch's float64 logsumexp within the
    terms' roundings (V half steps of the grid, against a sum of at least 1)."""
    for vocab in (260, 67, 1000):
        x = rows(vocab, (9, vocab))
        x[2, ::3] = float("-inf")
        with torch.no_grad():
            top, log_total = exact.log_normaliser(x.view(3, 3, vocab))
            want_top = x.amax(-1, keepdim=True)
            grid = 2.0 ** (52 - math.ceil(math.log2(vocab)))
            terms = (exact.exp((x - want_top).double()) * grid).round()
            want = exact.log(terms.sum(-1, keepdim=True) / grid)
            assert same_bits(top.view(9, 1), want_top)
            assert same_bits(log_total.view(9, 1), want)
            rest = (x - want_top).double()
            reference = torch.logsumexp(rest, -1, keepdim=True)
            assert ((want - reference).abs() <= vocab / grid).all()
