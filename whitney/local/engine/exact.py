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

What is left to the CPU is elementwise only: silu in torch's vector code, the same on AVX2 and
AVX-512; exp, log and sqrt, which torch hands to MKL's vector math, whose AVX2 and AVX-512 code
differ in the last bit (a known defect: `tests/engine/test_cpu_capability.py`, an expected failure
until they are computed here). Training's backward pass uses float32 BLAS, whose kernels differ
between CPUs, so gradients are the same bits on one machine type.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from whitney.local.engine import kernels, products

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
    """ceil(log2(y)) for float64 y >= 2**-1022, from the float's own bits (exact, no log kernel)."""
    bits = y.view(torch.int64)
    return (bits >> 52) - 1023 + ((bits & (2**52 - 1)) != 0).to(torch.int64)


@functools.cache
def power(exponent: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """2**exponent as a 0-dim tensor: a kernel's argument (one compiled kernel for every value;
    never an inference tensor, whatever mode it is first asked for in)."""
    with torch.inference_mode(False):
        return torch.tensor(2.0**exponent, dtype=dtype)


@functools.cache
def integer(value: int) -> Tensor:
    """`value` as a 0-dim int64 tensor: a kernel's argument (never an inference tensor)."""
    with torch.inference_mode(False):
        return torch.tensor(value, dtype=torch.int64)


def rows(x: Tensor) -> Tensor:
    """x [..., K] as float32 rows [N, K] (a view where x is float32 and contiguous), without
    dispatching a detach or conversion where none is needed (several calls a layer)."""
    if x.requires_grad:
        x = x.detach()
    if x.dtype != torch.float32:
        x = x.float()
    return x.view(-1, x.shape[-1]) if x.is_contiguous() else x.reshape(-1, x.shape[-1])


def examples() -> list[tuple[Tensor]]:
    """Rows to compile and check a kernel on: of several sizes, a flat one among them."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=gen) * 3
    x[1] = 1.0
    return [(x,), (x[:1, :7].contiguous() * 2.0**-60,)]


def row_steps(x: Tensor, unit: Tensor | float) -> Tensor:
    """Per row, `unit` over the power of two just above its largest element (the float32
    exponent bits of that element, doubled): the row's scale to its fixed-point grid."""
    largest = x.abs().amax(-1, keepdim=True)
    top = (largest.view(torch.int32) & EXPONENT_BITS).view(torch.float32) * 2.0
    return unit / top.clamp(min=2.0**-99)


def activation_grid(x: Tensor, room: Tensor) -> Tensor:
    """`activation_rows` of float32 rows [N, K], branch-free, with room = 52 - weight bits."""
    up = row_steps(x, 2.0**ACTIVATION_BITS)
    rounded = (x * up).round()
    magnitude = rounded.abs().sum(-1, keepdim=True, dtype=torch.float64) + x.shape[-1] / 2
    up = up / pow2((ceil_log2(magnitude) - room).clamp(min=0)).float()
    return (x * up).round().double() * (1.0 / up.double())


def activation_rows(x: Tensor, weight_bits: int) -> Tensor:
    """x's rows on their fixed-point grids for a product with weight rows of `weight_bits`:
    24 bits, fewer where the row's sum of magnitudes on the grid, times 2**weight_bits, could
    pass 2**53. That sum is of integers (exact in any order); the row's bits depend on it alone.

    Bound: at 24 bits each |n_i| <= |x_i| u + 1/2; with `shift` bits fewer, |m_i| <=
    (|n_i| + 1/2) / 2**shift + 1/2, so sum |m_i| <= 2**(52 - b) + K/2, and against weight
    integers of at most 2**b every partial sum is at most 2**52 + K * 2**(b - 1) <= 2**53 in
    units of its output's step."""
    return ACTIVATION_GRID(rows(x), room(weight_bits)).view(*x.shape[:-1], x.shape[-1])


def room(weight_bits: int) -> Tensor:
    """`activation_grid`'s room for weight rows of `weight_bits`: 52 - weight_bits."""
    return integer(MANTISSA_BITS - 1 - weight_bits)


def fixed_grid(x: Tensor, unit: Tensor) -> Tensor:
    """`fixed_point` of float32 rows [N, K], with unit = 2**bits."""
    up = row_steps(x, unit)
    return (x * up).round().double() * (1.0 / up.double())


def fixed_point(x: Tensor, bits: int) -> Tensor:
    """x as float64 with each row (last dim) rounded to its own power-of-two grid, on which its
    largest element has `bits` bits. The grid depends only on the row, so the result does too.
    (Scaling by a power of two is exact; rows below 2**-100 lose what lies under the grid.)"""
    # in float32, as in float64: x * up is exact (a power of two, at most 2**24 in magnitude, or
    # below 2**-100 where either rounds to 0), its rounding is too; 1 / up is a power of two as
    # well, so the product with it is the quotient
    return FIXED_GRID(rows(x), power(bits)).view(*x.shape[:-1], x.shape[-1])


def matmul(x: Tensor, w: Tensor) -> Tensor:
    """x @ w.T as float32 for operands on fixed-point rows: exact, then rounded once (a weight
    stored as float32 by `weight` through `products`)."""
    if w.dtype == torch.float32:
        return products.product(x, w)
    return torch.matmul(x, w.transpose(-1, -2)).float()


def linear(x: Tensor, w: Tensor) -> Tensor:
    """x [..., K] @ w.T for a weight w [N, K] already on fixed-point rows (`weight`): x float32,
    or float64 already on its activation rows (`activation_rows`, which depend on K alone)."""
    if x.dtype != torch.float64:
        x = activation_rows(x, weight_bits(x.shape[-1]))
    return matmul(x, w)


def weight(w: Tensor) -> Tensor:
    """A weight matrix [N, K] on fixed-point rows, ready for `linear`, stored as float32 (half
    the bytes a product reads): exact, as each row's <= 24-bit integers times its step, a power
    of two of at least 2**-123 (`row_steps`), are float32 numbers."""
    return fixed_point(w, weight_bits(w.shape[-1])).float()


def mean_square_rows(x: Tensor, unit: Tensor) -> Tensor:
    """`mean_square` of float32 rows [N, K], with unit = 2**bits_for(K)."""
    fixed = fixed_grid(x, unit)
    return ((fixed * fixed).sum(-1, keepdim=True) / x.shape[-1]).float()


def mean_square(x: Tensor) -> Tensor:
    """Mean of x**2 over the last dim, exactly (a sum of squared integers), as float32."""
    unit = power(bits_for(x.shape[-1]))
    return MEAN_SQUARE(rows(x), unit).view(*x.shape[:-1], 1)


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


def shifted(x: Tensor) -> tuple[Tensor, Tensor]:
    """Float32 rows' max, and the rows less it in float64."""
    top = x.amax(-1, keepdim=True)
    return top, (x - top).double()


def exact_total(terms: Tensor, grid: Tensor) -> Tensor:
    """The sum of each row of `terms` (float64, at most 1) rounded to the step 1 / grid."""
    return (terms * grid).round().sum(-1, keepdim=True) / grid


def log_normaliser(x: Tensor) -> tuple[Tensor, Tensor]:
    """The row's max (float32) and the log of the exact sum of exp(x - max) (float64): the exp
    of the shifted row in float64 through the vector code, each term on the grid
    2**-(52 - log2 V) (terms are at most 1, so their sum is exact in any order)."""
    top, rest = SHIFTED(rows(x))
    terms = vectorized(torch.exp, rest)
    grid = power(MANTISSA_BITS - 1 - math.ceil(math.log2(max(x.shape[-1], 2))), torch.float64)
    total = EXACT_TOTAL(terms, grid)
    lead = x.shape[:-1]
    return top.view(*lead, 1), vectorized(torch.log, total).view(*lead, 1)


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


def examples_double() -> list[tuple[Tensor, Tensor]]:
    """`exact_total`'s example: terms in [0, 1] and a grid."""
    terms = torch.rand(4, 300, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return [
        (terms, power(43, torch.float64)),
        (terms[:1, :5].contiguous(), power(40, torch.float64)),
    ]


ACTIVATION_GRID = kernels.kernel(lambda: [(x, integer(30)) for (x,) in examples()])(activation_grid)
FIXED_GRID = kernels.kernel(lambda: [(x, power(21)) for (x,) in examples()])(fixed_grid)
MEAN_SQUARE = kernels.kernel(lambda: [(x, power(21)) for (x,) in examples()])(mean_square_rows)
SHIFTED = kernels.kernel(examples, eager_from=1 << 17)(shifted)  # torch's reduction is faster
EXACT_TOTAL = kernels.kernel(examples_double)(exact_total)
