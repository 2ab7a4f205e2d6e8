"""The kernels that fuse a layer's exact elementwise work without gradients give the bits of the
unfused sequence the gradient path runs (the same operations in the same order): silu(gate) * up
and the down projection's rows, RoPE with the queries' fixed-point rows and the stored keys and
values, the residual add with RMSNorm and its product's activation rows; silu of the gate half
read in place gives `silu`'s bits; and with gradients, `Gated` gives the value and gradient of
autograd through the unfused silu(gate) * up, and the kernels of the gradient path give the bits
of plain torch (autograd for a gradient) through the expressions they fuse: RMSNorm's scaling and
its backward's parts, the attention's gradient to its scores, its kept weights over their sums,
RoPE of the queries and keys; and the head's log-softmax normaliser, the bits of its unfused
operations. Random rows, a flat row, a row of tiny elements, grouped-query heads; compared as raw
bits (each kernel runs eagerly or compiled, whichever is loaded: the two are checked against each
other at load)."""

from __future__ import annotations

import math

import torch

from whitney.local.engine import exact
from whitney.local.engine.kernels import same_bits
from whitney.local.engine.model import (
    NORM_GRADIENT_PARTS,
    NORM_MEAN_GRADIENT,
    NORM_SCALED,
    NORMALISED,
    QUERIES_KEY_VALUES,
    ROTATED,
    SCORE_GRADIENT,
    Gated,
    KeyValues,
    gate_silu,
    gated_rows,
    norm_rows,
    rope,
    score_scale,
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
            normed = weight * (total / exact.square_root(exact.mean_square(total) + eps))
            want = exact.activation_rows(normed, exact.weight_bits(k))
            got_total, got = norm_rows(x, weight, eps, delta)
            assert same_bits(got_total, total)
            assert same_bits(got, want)
            assert same_bits(norm_rows(total, weight, eps)[1], want)


def test_rms_norm_kernels_give_autograds_bits_through_weight_times_x_over_root() -> None:
    """weight * (x / root) and its gradients to x and to root (summed over the row) by autograd,
    with root a leaf; and (x * 2) * g as autograd's gradient of x**2. Rows 576 and 67 wide (past
    a vector loop's lanes), zeros of both signs in the upstream gradient."""
    gen = torch.Generator().manual_seed(6)
    for k in (576, 67, 5):
        x, upstream = rows(k, (7, k)), rows(k + 1, (7, k))
        upstream[2, ::3], upstream[3, 1::3] = 0.0, -0.0
        root = torch.rand(7, 1, generator=gen) * 3 + 0.25
        weight = torch.rand(k, generator=gen) + 0.5
        leaf_x, leaf_root = x.clone().requires_grad_(), root.clone().requires_grad_()
        want = weight * (leaf_x / leaf_root)
        want_x, want_root = torch.autograd.grad(want, (leaf_x, leaf_root), upstream)
        assert same_bits(NORM_SCALED(x, root, weight), want.detach())
        grad_x, terms = NORM_GRADIENT_PARTS(upstream, weight, x, root)
        assert same_bits(grad_x, want_x)
        assert same_bits(terms.sum(-1, keepdim=True), want_root)
        grad_mean = torch.randn(7, 1, generator=gen)
        leaf = x.clone().requires_grad_()
        (want_mean,) = torch.autograd.grad(leaf.pow(2), leaf, grad_mean.expand(7, k))
        assert same_bits(NORM_MEAN_GRADIENT(x, grad_mean), want_mean)


def test_score_gradient_is_softmaxs_gradient_to_the_scaled_scores() -> None:
    """((dp - sum_j p_j dp_j) * p) * scale, by plain torch ops, at 43 and 67 keys (hidden keys'
    probabilities 0), grouped heads [B, kv, rows, keys], head sizes 64 and 96."""
    gen = torch.Generator().manual_seed(7)
    for shape, d in (((16, 3, 129, 43), 64), ((2, 2, 6, 67), 96)):
        probs = torch.rand(shape, generator=gen)
        probs[..., -3:] = 0.0
        grad_p = torch.randn(shape, generator=gen)
        along = torch.randn((*shape[:-1], 1), generator=gen)
        scale = 1.0 / d**0.5
        want = torch.mul(torch.mul(torch.sub(grad_p, along), probs), scale)
        assert same_bits(SCORE_GRADIENT(grad_p, along, probs, score_scale(d)), want)


def test_normalised_is_the_weights_over_their_sums_in_float64() -> None:
    gen = torch.Generator().manual_seed(8)
    for shape in ((16, 9, 43, 43), (1, 2, 3, 67)):
        p = torch.rand(shape, generator=gen)
        p[..., -2:] = 0.0
        total = torch.rand((*shape[:-1], 1), generator=gen, dtype=torch.float64) * 40 + 1
        want = torch.div(p.to(torch.float64), total).to(torch.float32)
        assert same_bits(NORMALISED(p, total), want)


def test_rotated_is_rope_of_the_queries_and_keys() -> None:
    """x * cos + rotate_half(x) * signed_sin written out, on the heads before the values, with
    grouped-query heads and a head of 68 (halves past a vector loop's lanes)."""
    gen = torch.Generator().manual_seed(9)
    for heads, kv, d in ((4, 4, 32), (9, 3, 64), (6, 2, 68)):
        qkv = torch.randn(3, 6, heads + 2 * kv, d, generator=gen) * 3
        cos, sin = torch.randn(2, 3, 6, 1, d, generator=gen)
        x, half = qkv[:, :, : heads + kv], d // 2
        want = x * cos + torch.cat((x[..., half:], x[..., :half]), -1) * sin
        shaped = qkv.view(3, 6, heads // kv + 2, kv, d)
        got = ROTATED(shaped, cos[:, :, None], sin[:, :, None])
        assert same_bits(got.view(want.shape), want)


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
