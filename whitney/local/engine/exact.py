"""The engine's arithmetic, batch-invariant by construction.

Every reduction that produces a sequence's numbers is either exact or has a fixed order:

- dot products (projections, attention scores, attention-weighted sums, sums of squares) are
  exact in float64, so no summation order, blocking, thread count, BLAS kernel or CPU can
  change them: each row of an operand is rounded to its own power-of-two grid with few enough
  bits (`fixed_point`) that every product and partial sum is an integer of at most 2**53 times
  the one power of two of its output element. The one rounding is the final cast to float32.
  A projection's activation row keeps all of float32's 24 bits unless its own magnitudes say
  it cannot (`activation_rows`), which leaves its weight rows more bits (`weight_bits`) than an
  even split would: both roundings move logprobs (a trained adapter's merged weights have
  full mantissas), and so parity with float32 transformers on SmolLM2 is within 1e-4;
- sums over a datum's tokens run strictly left to right (`prefix_sum`), so padding after the
  datum adds exact zeros and changes nothing;
- transcendental elementwise functions (`vectorized`) are applied in slices that torch runs
  serially with no scalar tail, so every element goes through the same vector code whatever
  the tensor's size (torch's vector and scalar paths of silu or rsqrt differ in the last bit);
- the normaliser of a softmax is an exact sum too (`log_softmax`): torch's own kernel sums in
  an order set by the CPU's vector width, so AVX2 and AVX-512 machines would disagree.

What is left to the CPU is elementwise only (exp, log, silu in torch's vector code, the same on
AVX2 and AVX-512: `tests/engine/test_cpu_capability.py`); training's backward pass uses float32
BLAS, whose kernels differ between CPUs, so gradients are the same bits on one machine type.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

MANTISSA_BITS = 53  # float64: every integer below 2**53 is exact, and so is every partial sum
EXPONENT_BITS = 0x7F800000  # of a float32
SLICE = 32704  # elements per `vectorized` call: a multiple of 64 below torch's GRAIN_SIZE (32768)


def pow2(exponent: Tensor) -> Tensor:
    """2**exponent as float64, built from its bits (exact, no pow kernel involved)."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


ACTIVATION_BITS = 24
"""Bits of a projection's activation row: all of a float32's mantissa, where it fits."""
WEIGHT_HEADROOM = 3
"""Bits a weight row takes beyond what a flat 24-bit activation row would leave it: activation
rows are rarely flat, and the few that are give up bits (`activation_rows`). On SmolLM2, 93%
of rows keep all 24 bits, the rest 23 or 22."""


def bits_for(length: int) -> int:
    """Bits per operand such that a dot product of `length` terms stays below 2**53."""
    return min(24, (MANTISSA_BITS - 1 - math.ceil(math.log2(max(length, 2)))) // 2)


def weight_bits(length: int) -> int:
    """Bits of a weight row of `length` elements, for `linear`."""
    fits = MANTISSA_BITS - ACTIVATION_BITS - (length - 1).bit_length()
    return min(24, fits + WEIGHT_HEADROOM)


def ceil_log2(y: Tensor) -> Tensor:
    """ceil(log2(y)) for y > 0, from the float's own exponent (exact, no log kernel)."""
    mantissa, exponent = torch.frexp(y)
    return exponent - (mantissa == 0.5).to(exponent.dtype)


def activation_rows(x: Tensor, weight_bits: int) -> Tensor:
    """x's rows on their fixed-point grids for a product with weight rows of `weight_bits`:
    24 bits, fewer where the row's sum of magnitudes on the grid, times 2**weight_bits, could
    pass 2**53. That sum is of integers (exact in any order); the row's bits depend on it alone.

    Bound: at 24 bits each |n_i| <= |x_i| u + 1/2; with `shift` bits fewer, |m_i| <=
    (|n_i| + 1/2) / 2**shift + 1/2, so sum |m_i| <= 2**(52 - b) + K/2, and against weight
    integers of at most 2**b every partial sum is at most 2**52 + K * 2**(b - 1) <= 2**53 in
    units of its output's step."""
    x = x.detach().float()
    largest = x.abs().amax(-1, keepdim=True)
    top = (largest.view(torch.int32) & EXPONENT_BITS).view(torch.float32) * 2.0
    up = 2.0**ACTIVATION_BITS / top.clamp_(min=2.0**-99)
    rounded = (x * up).round_()
    magnitude = rounded.abs().sum(-1, keepdim=True, dtype=torch.float64) + x.shape[-1] / 2
    room = MANTISSA_BITS - 1 - weight_bits
    if bool((magnitude > 2.0**room).any()):  # rows that need a coarser grid (the others keep it)
        up = up / pow2((ceil_log2(magnitude) - room).clamp_(min=0)).float()
        rounded = (x * up).round_()
    return rounded.double().mul_(1.0 / up.double())


def fixed_point(x: Tensor, bits: int) -> Tensor:
    """x as float64 with each row (last dim) rounded to its own power-of-two grid, on which its
    largest element has `bits` bits. The grid depends only on the row, so the result does too.
    (Scaling by a power of two is exact; rows below 2**-100 lose what lies under the grid.)"""
    x = x.detach().float()
    largest = x.abs().amax(-1, keepdim=True)
    # the power of two just above the row's largest element: its float32 exponent bits, doubled
    top = (largest.view(torch.int32) & EXPONENT_BITS).view(torch.float32) * 2.0
    up = 2.0**bits / top.clamp_(min=2.0**-99)
    # in float32, as in float64: x * up is exact (a power of two, at most 2**24 in magnitude, or
    # below 2**-100 where either rounds to 0), its rounding is too (torch's round is vectorized);
    # 1 / up is a power of two as well, so the product with it is the quotient
    return (x * up).round_().double().mul_(1.0 / up.double())


def matmul(x: Tensor, w: Tensor) -> Tensor:
    """x @ w.T as float32 for operands on fixed-point rows: exact, then rounded once."""
    return torch.matmul(x, w.transpose(-1, -2)).float()


def linear(x: Tensor, w: Tensor) -> Tensor:
    """x [..., K] @ w.T for a weight w [N, K] already on fixed-point rows (`weight`)."""
    return matmul(activation_rows(x, weight_bits(x.shape[-1])), w)


def weight(w: Tensor) -> Tensor:
    """A weight matrix [N, K] on fixed-point rows, ready for `linear`."""
    return fixed_point(w, weight_bits(w.shape[-1]))


def mean_square(x: Tensor) -> Tensor:
    """Mean of x**2 over the last dim, exactly (a sum of squared integers), as float32."""
    fixed = fixed_point(x, bits_for(x.shape[-1]))
    return ((fixed * fixed).sum(-1, keepdim=True) / x.shape[-1]).float()


def prefix_sum(x: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Sum over the last dim, strictly left to right (torch's cumsum on the CPU), so trailing
    padding zeros leave it unchanged."""
    return torch.cumsum(x, -1, dtype=dtype)[..., -1]


def vectorized(fn: Callable[..., Tensor], x: Tensor) -> Tensor:
    """fn (an elementwise torch op, which takes `out=`) applied through torch's vector code for
    every element: the flattened tensor in slices small enough to run serially, each a multiple
    of 64 elements, the tail padded to 64. The gradient is fn's own."""
    if x.requires_grad and torch.is_grad_enabled():
        return Vectorized.apply(x, fn)
    flat = x.reshape(-1)
    n = flat.numel()
    out = torch.empty_like(flat)
    body = n - n % 64
    for start in range(0, body, SLICE):
        stop = min(start + SLICE, body)
        fn(flat[start:stop], out=out[start:stop])
    if body < n:
        tail = torch.empty(64, dtype=out.dtype)
        fn(torch.nn.functional.pad(flat[body:], (0, 64 - (n - body))), out=tail)
        out[body:] = tail[: n - body]
    return out.view(x.shape)


class Vectorized(torch.autograd.Function):
    """`vectorized`'s value, with fn's gradient (fn run again in the backward, as autograd's)."""

    @staticmethod
    def forward(ctx, x: Tensor, fn: Callable[..., Tensor]) -> Tensor:
        ctx.save_for_backward(x)
        ctx.fn = fn
        return vectorized(fn, x.detach())

    @staticmethod
    def backward(ctx, grad: Tensor):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            leaf = x.detach().requires_grad_()
            (grad_x,) = torch.autograd.grad(ctx.fn(leaf), leaf, grad)
        return grad_x, None


def log_normaliser(x: Tensor) -> tuple[Tensor, Tensor]:
    """The row's max (float32) and the log of the exact sum of exp(x - max) (float64): the exp
    of the shifted row in float64 through the vector code, each term on the grid
    2**-(52 - log2 V) (terms are at most 1, so their sum is exact in any order)."""
    top = x.detach().amax(-1, keepdim=True)
    terms = vectorized(torch.exp, (x.detach() - top).double())
    grid = 2.0 ** (MANTISSA_BITS - 1 - math.ceil(math.log2(max(x.shape[-1], 2))))
    total = terms.mul_(grid).round_().sum(-1, keepdim=True) / grid
    return top, vectorized(torch.log, total)


def log_softmax(x: Tensor) -> Tensor:
    """log softmax over the last dim, the same bits on every CPU: x minus the row's max, less the
    log of the exact normaliser (`log_normaliser`) in float64, rounded once to float32. The
    gradient is torch's log_softmax's."""
    top, log_total = log_normaliser(x)
    exact_value = ((x.detach() - top).double() - log_total).float()
    if not x.requires_grad:
        return exact_value
    soft = x.log_softmax(-1)
    return exact_value + (soft - soft.detach())


def log_softmax_at(x: Tensor, index: Tensor) -> Tensor:
    """`log_softmax(x).gather(-1, index)` (no gradient), the same bits without the other
    elements."""
    top, log_total = log_normaliser(x)
    return ((x.detach().gather(-1, index) - top).double() - log_total).float()
