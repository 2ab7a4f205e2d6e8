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
- exp, log and sqrt are the engine's own (`exp`, `log`, `sqrt_float32`), and so are sin and
  cos (`sin`, `cos`: RoPE's tables, with its inverse frequencies' pow as `exp` of a `log`,
  built once per config, eagerly), built only from operations IEEE rounds correctly on every
  CPU (add, subtract, multiply, divide, compare, round half to even, integer and bit
  operations, bitcasts), one tensor op each in a fixed order, so eager and compiled
  (`kernels`, with no contraction into fused multiply-adds) give the same bits on every CPU:
  torch's own exp, log and sqrt go to MKL's vector math, which picks its code by the CPU (its
  AVX2 and AVX-512 code differ in the last bit), its float32 sqrt is not correctly rounded,
  and its sin, cos and pow are vector code chosen by the CPU as well;
- silu is applied in slices (`vectorized`) that torch runs serially with no scalar tail, so
  every element goes through the same vector code whatever the tensor's size (torch's vector
  and scalar paths of silu differ in the last bit); that code is torch's own, the same on AVX2
  and AVX-512;
- the normaliser of a softmax is an exact sum too (`log_softmax`): torch's own kernel sums in
  an order set by the CPU's vector width, so AVX2 and AVX-512 machines would disagree.

So a sequence's numbers are the same bits on AVX2 and AVX-512 machines
(`tests/engine/test_cpu_capability.py`). Training's backward pass uses float32 BLAS, whose
kernels differ between CPUs, so gradients are the same bits on one machine type.
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
    """fn (an elementwise torch op, which takes `out=`: silu) applied through torch's vector code
    for every element: the flattened tensor in slices small enough to run serially, each a
    multiple of 64 elements, the tail padded to 64; rows [N, K] of a wider tensor, K a multiple of
    64 (at most `SLICE`), read in place, whole rows a slice. The gradient is fn's own."""
    if x.requires_grad and torch.is_grad_enabled():
        return Vectorized.apply(x, fn)
    if x.dim() == 2 and x.stride(1) == 1 and x.shape[1] % 64 == 0 and 0 < x.shape[1] <= SLICE:
        out = torch.empty(x.shape, dtype=x.dtype)
        step = SLICE // x.shape[1]
        for start in range(0, x.shape[0], step):
            fn(x[start : start + step], out=out[start : start + step])
        return out
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


LN2_HI = 6.93147180369123816490e-01
"""ln 2's leading 32 bits (fdlibm's ln2HI, low 21 bits of its mantissa zero): k * LN2_HI is
exact for every |k| < 2**21."""
LN2_LO = 1.90821492927058770002e-10
"""ln 2 - LN2_HI (fdlibm's ln2LO)."""
LOG2_E = 1.44269504088896338700e00
EXP_POLYNOMIAL = (
    1.66666666666666019037e-01,
    -2.77777777770155933842e-03,
    6.61375632143793436117e-05,
    -1.65339022054652515390e-06,
    4.13813679705723846039e-08,
)
"""fdlibm's P1..P5: r - r**2 (P1 + r**2 (P2 + ...)) = r (exp(r) + 1) / (exp(r) - 1) - 2 to
within 2**-59 on |r| <= ln2 / 2."""
EXP_LOW = -708.0
"""Below this `exp` returns exactly 0: exp(-708) = 3.3e-308 is still a normal float64
(k = -1021)."""
EXP_HIGH = 709.782712893384
"""Above this (ln of the largest float64) `exp` returns inf."""
LOG_SERIES = tuple(2.0 / (2 * n + 1) for n in range(1, 12))
"""2/3, 2/5, ..., 2/23: 2 atanh(s) = 2 s + s R(s**2) with R = sum 2 s**(2n) / (2n + 1); for
|s| <= 0.1716 the first term left out, 2 s**24 / 25, is below 2**-62 of 2 s."""


def horner(z: Tensor, coefficients: tuple[float, ...]) -> Tensor:
    """c0 + z (c1 + z (c2 + ...)), innermost first."""
    p = coefficients[-1]
    for coefficient in coefficients[-2::-1]:
        p = z * p + coefficient
    return p


def exp(x: Tensor) -> Tensor:
    """e**x of float64 x, within 1 ulp, from correctly rounded IEEE operations only (the same
    bits on every CPU, eager or compiled): fdlibm's e_exp.c without its branches. k =
    round(x log2 e), r = x - k ln 2 in two parts (Cody and Waite: x - k LN2_HI is exact),
    e**r by fdlibm's rational form, times 2**k from its bits (`pow2`, as 2 * 2**(k - 1) so that
    k = 1024 fits). NaN gives NaN, +inf inf, and every x below EXP_LOW (-inf included) exactly 0
    rather than a subnormal: every use rounds such a value to 0 anyway (a float32 result is 0
    below -103.97, ln 2**-150; the normaliser's terms sit on a grid of 2**-51 or coarser, which
    takes every term below 2**-52, x < -36.05, to 0)."""
    inside = x.clamp(EXP_LOW, EXP_HIGH)
    k = (inside * LOG2_E).round()
    hi = inside - k * LN2_HI
    lo = k * LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * horner(t, EXP_POLYNOMIAL)
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    value = (y * 2.0) * pow2(k - 1.0)
    value = torch.where(x < EXP_LOW, 0.0, torch.where(x > EXP_HIGH, math.inf, value))
    return torch.where(x != x, x, value)


def exp_float32(x: Tensor) -> Tensor:
    """e**x of float32 x: `exp` in float64, rounded once to float32."""
    return exp(x.double()).float()


def log(x: Tensor) -> Tensor:
    """ln x of float64 x, within 1 ulp, from correctly rounded IEEE operations only: fdlibm's
    e_log.c without its branches. x = 2**e m from the bits (subnormals scaled by 2**54 first),
    m folded into [sqrt(1/2), sqrt(2)); with f = m - 1 (exact) and s = f / (2 + f),
    ln m = 2 atanh(s) = f - (f**2/2 - s (f**2/2 + R)), R the odd series' tail (`LOG_SERIES`);
    plus e ln 2 in two parts. 0 gives -inf, inf inf, negative x and NaN give NaN."""
    small = x < 2.0**-1022
    scaled = torch.where(small, x * 2.0**54, x)
    bits = scaled.view(torch.int64)
    mantissa = bits & (2**52 - 1)
    high = mantissa >= 0x6A09E667F3BCD  # m = 1.mantissa at or above sqrt(2): halve it
    e = (bits >> 52) - 1023 - torch.where(small, 54, 0) + high.to(torch.int64)
    m = (mantissa | torch.where(high, 1022 << 52, 1023 << 52)).view(torch.float64)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    tail = z * horner(z, LOG_SERIES)
    half_square = 0.5 * f * f
    k = e.to(torch.float64)
    value = k * LN2_HI - ((half_square - (s * (half_square + tail) + k * LN2_LO)) - f)
    value = torch.where(x == math.inf, math.inf, torch.where(x == 0.0, -math.inf, value))
    return torch.where(x >= 0.0, value, math.nan)


SIN_COS_LIMIT = 2.0**19 * math.pi / 2
"""`sin` and `cos` take |x| up to this, fdlibm's medium case (e_rem_pio2.c): x - n pi/2 in three
parts of pi/2 is then as exact as fdlibm's (n < 2**20); beyond it they raise ValueError."""
TWO_OVER_PI = 6.36619772367581382433e-01
PI_OVER_2 = (1.57079632673412561417e00, 6.07710050630396597660e-11, 2.02226624871116645580e-21)
"""fdlibm's pio2_1, pio2_2, pio2_3: pi/2 cut into three parts of at most 33 bits, so n times
each is exact for every n < 2**20."""
PI_OVER_2_REST = 8.47842766036889956997e-32
"""fdlibm's pio2_3t: pi/2 less its three parts `PI_OVER_2`."""
SIN_POLYNOMIAL = (
    -1.66666666666666324348e-01,
    8.33333333332248946124e-03,
    -1.98412698298579493134e-04,
    2.75573137070700676789e-06,
    -2.50507602534068634195e-08,
    1.58969099521155010221e-10,
)
"""fdlibm's S1..S6: sin(x) / x ~ 1 + x**2 (S1 + x**2 S2 + ... + x**10 S6) within 2**-58 on
|x| <= pi/4."""
COS_POLYNOMIAL = (
    4.16666666666666019037e-02,
    -1.38888888888741095749e-03,
    2.48015872894767294178e-05,
    -2.75573143513906633035e-07,
    2.08757232129817482790e-09,
    -1.13596475577881948265e-11,
)
"""fdlibm's C1..C6: cos(x) ~ 1 - x**2 / 2 + x**4 (C1 + x**2 C2 + ... + x**10 C6) within 2**-58
on |x| <= pi/4."""


def difference(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """a - b rounded, and its rounding error: a - b = s + e exactly, whatever the magnitudes
    (Knuth's TwoSum of a and -b, branch-free)."""
    s = a - b
    bb = s - a
    return s, (a - (s - bb)) - (b + bb)


def quarter_turns(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """n = round(x 2/pi) and x - n pi/2 as y + tail, for 0 <= x <= SIN_COS_LIMIT: fdlibm's
    e_rem_pio2.c medium case with all three steps always taken and each step's rounding error
    kept exactly (`difference`) where fdlibm branches on how much cancelled. n has at most 20
    bits, so n times each part of pi/2 is exact, and so is x - n PI_OVER_2[0] (Sterbenz: the
    two are within a factor 2); the errors and n PI_OVER_2_REST, together far below y's ulp,
    make the tail."""
    n = (x * TWO_OVER_PI).round()
    r = x - n * PI_OVER_2[0]
    r, second = difference(r, n * PI_OVER_2[1])
    r, third = difference(r, n * PI_OVER_2[2])
    w = n * PI_OVER_2_REST - (second + third)
    y = r - w
    return n, y, (r - y) - w


def kernel_sin(y: Tensor, tail: Tensor) -> Tensor:
    """sin(y + tail) for |y| <= about pi/4, tail below half y's ulp: fdlibm's k_sin.c with a
    tail (iy = 1)."""
    z = y * y
    v = z * y
    r = horner(z, SIN_POLYNOMIAL[1:])
    return y - ((z * (0.5 * tail - v * r) - tail) - v * SIN_POLYNOMIAL[0])


def kernel_cos(y: Tensor, tail: Tensor) -> Tensor:
    """cos(y + tail) for |y| <= about pi/4, tail below half y's ulp: fdlibm's k_cos.c, its last
    sum as FreeBSD's msun (and musl) write it, branch-free: w = 1 - y**2/2 plus that
    subtraction's rounding error, instead of fdlibm's branch on |y|."""
    z = y * y
    r = z * horner(z, COS_POLYNOMIAL)
    half = 0.5 * z
    w = 1.0 - half
    return w + (((1.0 - w) - half) + (z * r - y * tail))


def sine_quarter_turns(x: Tensor, turns: int) -> Tensor:
    """sin(x + turns pi/2) for 0 <= x <= SIN_COS_LIMIT: with x = n pi/2 + y (`quarter_turns`),
    by (n + turns) mod 4 one of sin(y), cos(y), -sin(y), -cos(y), each computed and selected."""
    n, y, tail = quarter_turns(x)
    quadrant = (n.to(torch.int64) + turns) & 3
    value = torch.where(quadrant & 1 == 0, kernel_sin(y, tail), kernel_cos(y, tail))
    return torch.where(quadrant >= 2, -value, value)


def magnitude_in_domain(x: Tensor) -> Tensor:
    """|x| for `sin` and `cos`, inf and NaN taken as 0 (their result is NaN); ValueError where a
    finite |x| passes SIN_COS_LIMIT."""
    magnitude = torch.where(x.isfinite(), x.abs(), 0.0)
    largest = float(magnitude.max()) if magnitude.numel() else 0.0
    if largest > SIN_COS_LIMIT:
        raise ValueError(
            f"exact.sin and exact.cos take |x| <= 2**19 pi/2 = {SIN_COS_LIMIT} "
            f"(fdlibm's medium argument reduction), not {largest}"
        )
    return magnitude


def sin(x: Tensor) -> Tensor:
    """sin of float64 x, |x| <= SIN_COS_LIMIT (ValueError beyond), within 1 ulp, from correctly
    rounded IEEE operations only, branch-free (the same bits on every CPU): fdlibm's reduction by
    pi/2 in three parts (`quarter_turns`) and its kernels (`kernel_sin`, `kernel_cos`), on |x|
    with x's sign put back (-0 stays -0). inf and NaN give NaN."""
    value = sine_quarter_turns(magnitude_in_domain(x), 0)
    return torch.where(x.isfinite(), torch.where(x.signbit(), -value, value), math.nan)


def cos(x: Tensor) -> Tensor:
    """cos of float64 x, |x| <= SIN_COS_LIMIT (ValueError beyond), within 1 ulp, as `sin`: cos of
    |x| is sin(|x| + pi/2). inf and NaN give NaN."""
    value = sine_quarter_turns(magnitude_in_domain(x), 1)
    return torch.where(x.isfinite(), value, math.nan)


def sqrt_float32(x: Tensor) -> Tensor:
    """The correctly rounded square root of float32 x, whatever the float64 root's last bit:
    r, the float64 root rounded to float32, is within one step of the right float32 (the float64
    root is within a few of its own ulps), so r moves up one step where the midpoint above it
    squared is below x, down where the midpoint below squared is above. The midpoints have 25
    significant bits, so their squares are exact in float64, and none is a root of a float32:
    a midpoint is an odd 25-bit integer times a power of two, its square an odd integer of
    49 or more bits times one, and a float32 has 24. 0, inf and NaN stay as they are."""
    wide = x.double()
    r = wide.sqrt().float()
    bits = r.view(torch.int32)
    up, down = (bits + 1).view(torch.float32), (bits - 1).view(torch.float32)
    root = r.double()
    above, below = (root + up.double()) * 0.5, (root + down.double()) * 0.5
    return torch.where(above * above < wide, up, torch.where(below * below > wide, down, r))


def elementwise(
    kernel: kernels.Kernel, x: Tensor, gradient: Callable[[Tensor, Tensor], Tensor]
) -> Tensor:
    """An elementwise kernel of flat tensors applied to x of any shape; under autograd, its
    gradient `gradient(grad, value)` from the value (`FromValue`)."""
    if x.requires_grad and torch.is_grad_enabled():
        return FromValue.apply(x, kernel, gradient)
    return kernel(x.reshape(-1)).view(x.shape)


class FromValue(torch.autograd.Function):
    """`elementwise`'s value; its gradient computed from that value."""

    @staticmethod
    def forward(ctx, x: Tensor, kernel: kernels.Kernel, gradient: Callable) -> Tensor:
        value = elementwise(kernel, x, gradient)
        ctx.save_for_backward(value)
        ctx.gradient = gradient
        return value

    @staticmethod
    def backward(ctx, grad: Tensor):
        (value,) = ctx.saved_tensors
        return ctx.gradient(grad, value), None, None


def exponential(x: Tensor) -> Tensor:
    """e**x of float32 or float64 x (`exp`, `exp_float32`), the same bits on every CPU; the
    gradient is exp's own (grad times the value)."""
    kernel = EXP if x.dtype == torch.float64 else EXP_FLOAT32
    return elementwise(kernel, x, lambda grad, value: grad * value)


def square_root(x: Tensor) -> Tensor:
    """The correctly rounded root of float32 x (`sqrt_float32`); the gradient is sqrt's own
    (grad / (2 root))."""
    return elementwise(SQRT, x, lambda grad, root: grad / (2 * root))


def log_exact_total(rest: Tensor, grid: Tensor) -> Tensor:
    """The log (`log`) of the sum of each row's exp (`exp`) of `rest` (float64, at most 0), each
    term rounded to the step 1 / grid: terms are at most 1, so their sum is exact in any order."""
    return log((exp(rest) * grid).round().sum(-1, keepdim=True) / grid)


def log_shifted_total(x: Tensor, top: Tensor, grid: Tensor) -> Tensor:
    """`log_exact_total` of float32 rows [N, V] less their max `top` [N, 1], the difference
    widened to float64: one pass over the rows, no shifted copy of them."""
    return log_exact_total((x - top).double(), grid)


def log_normaliser(x: Tensor) -> tuple[Tensor, Tensor]:
    """The row's max (float32, torch's reduction) and the log of the exact sum of exp(x - max)
    (float64): each term on the grid 2**-(52 - log2 V) (`log_shifted_total`)."""
    flat = rows(x)
    top = flat.amax(-1, keepdim=True)
    grid = power(MANTISSA_BITS - 1 - math.ceil(math.log2(max(x.shape[-1], 2))), torch.float64)
    lead = x.shape[:-1]
    return top.view(*lead, 1), LOG_SHIFTED_TOTAL(flat, top, grid).view(*lead, 1)


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


def examples_shifted() -> list[tuple[Tensor, Tensor, Tensor]]:
    """`log_shifted_total`'s examples: float32 rows (some -inf, one of 67, past a vector loop's
    lanes), their max and a grid."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(4, 300, generator=gen) * -60.0 + 7.0
    x[1, 7:20] = -math.inf
    wide = torch.randn(3, 67, generator=gen) * 9.0
    first = x[:1, :5].contiguous()
    return [
        (x, x.amax(-1, keepdim=True), power(43, torch.float64)),
        (first, first.amax(-1, keepdim=True), power(40, torch.float64)),
        (wide, wide.amax(-1, keepdim=True), power(45, torch.float64)),
    ]


def flat_examples(dtype: torch.dtype) -> list[tuple[Tensor]]:
    """An elementwise kernel's examples: every exponent range, the domain's ends, 0 and inf."""
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(1000, generator=gen, dtype=torch.float64) * 300.0
    ends = [EXP_LOW, EXP_HIGH, 0.0, -0.0, math.inf, -math.inf, 1e-310, 2.0**-1022, 1.0, 4.0]
    x = torch.cat([wide, torch.tensor(ends, dtype=torch.float64)]).to(dtype)
    return [(x,), (x[-7:].contiguous(),)]


def root_examples() -> list[tuple[Tensor]]:
    """`sqrt_float32`'s examples: float32 of every exponent (subnormals too), 0, 1, 4 and inf."""
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(0, EXPONENT_BITS, (1000,), generator=gen, dtype=torch.int32)
    ends = torch.tensor([0.0, 1.0, 4.0, math.inf])
    x = torch.cat([bits.view(torch.float32), ends])
    return [(x,), (x[-7:].contiguous(),)]


ACTIVATION_GRID = kernels.kernel(lambda: [(x, integer(30)) for (x,) in examples()])(activation_grid)
FIXED_GRID = kernels.kernel(lambda: [(x, power(21)) for (x,) in examples()])(fixed_grid)
MEAN_SQUARE = kernels.kernel(lambda: [(x, power(21)) for (x,) in examples()])(mean_square_rows)
LOG_SHIFTED_TOTAL = kernels.kernel(examples_shifted)(log_shifted_total)
EXP = kernels.kernel(lambda: flat_examples(torch.float64))(exp)
EXP_FLOAT32 = kernels.kernel(lambda: flat_examples(torch.float32))(exp_float32)
SQRT = kernels.kernel(root_examples)(sqrt_float32)
