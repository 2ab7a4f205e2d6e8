"""The engine's arithmetic (`whitney.local.engine.exact`) against independent computations: exact
rational arithmetic in Python for the dot products, and each element or row computed alone."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

from whitney.local.engine import exact


def random_rows(seed: int, shape: tuple[int, ...], spread: float = 4.0) -> torch.Tensor:
    """Values across several binades, some rows much smaller than others."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    return x * torch.exp2(torch.randint(-8, 8, (*shape[:-1], 1), generator=gen) / spread)


def test_fixed_point_keeps_bits_bits_of_each_rows_largest_element() -> None:
    x = random_rows(0, (50, 128))
    largest = x.abs().amax(-1, keepdim=True).double()
    grid = torch.exp2(torch.frexp(largest).exponent.double())  # the power of two above
    for bits in (12, 20, 23):
        fixed = exact.fixed_point(x, bits)
        ints = fixed / (grid * 2.0**-bits)
        assert torch.equal(ints, ints.round())  # on the row's own grid
        assert ints.abs().max() <= 2**bits
        assert bool(((fixed - x.double()).abs() <= largest * 2.0 ** (-bits)).all())


def fraction_rows(x: torch.Tensor, bits: list[int]) -> list[list[Fraction]]:
    """Each row rounded (half to even) to `bits[i]` bits of the power of two above its largest
    element, in rational arithmetic."""
    out = []
    for row, b in zip(x.tolist(), bits, strict=True):
        top = Fraction(2) ** (math.frexp(max(abs(v) for v in row))[1])
        step = top / 2**b
        out.append([round(Fraction(v) / step) * step for v in row])
    return out


def expected_activation_bits(x: torch.Tensor, weight_bits: int) -> list[int]:
    """24 bits, one fewer until the row's integers, summed in magnitude (plus K/2), fit in
    2**(52 - weight_bits): the rule of exact.activation_rows, by hand."""
    bits = []
    for row in x.tolist():
        top = Fraction(2) ** (math.frexp(max(abs(v) for v in row))[1])
        total = sum(abs(round(Fraction(v) * 2**24 / top)) for v in row) + Fraction(len(row), 2)
        shift = 0
        while total > 2 ** (52 - weight_bits + shift):
            shift += 1
        bits.append(24 - shift)
    return bits


def exact_products(xs: list[list[Fraction]], ws: list[list[Fraction]]) -> list[list[float]]:
    """Each row pair's dot product in rational arithmetic, rounded once to float32."""
    rounded = [[float(sum(a * b for a, b in zip(x, w, strict=True))) for w in ws] for x in xs]
    return torch.tensor(rounded, dtype=torch.float64).float().tolist()


@pytest.mark.parametrize("k", [40, 576, 1536])
def test_linear_is_the_exact_dot_product_rounded_once(k: int) -> None:
    """Activation rows on 24 bits (fewer where their magnitudes need it), weight rows on
    `weight_bits(k)`: each output the rational dot product, rounded once."""
    x, w = random_rows(1, (4, k)), random_rows(2, (3, k))
    x[0] = x[0].abs()  # a flat row, which must give up bits
    b = exact.weight_bits(k)
    fw = exact.weight(w)
    ws = fraction_rows(w, [b] * 3)
    assert fw.tolist() == [[float(v) for v in row] for row in ws]
    bits = expected_activation_bits(x, b)
    assert exact.activation_rows(x, b).tolist() == [
        [float(v) for v in row] for row in fraction_rows(x, bits)
    ]
    assert exact.linear(x, fw).tolist() == exact_products(fraction_rows(x, bits), ws)


@pytest.mark.parametrize("k", [1, 8, 40, 576, 1536, 2048, 49152])
def test_every_partial_sum_fits_in_float64_whatever_the_rows(k: int) -> None:
    """The flattest activation row (every element at its largest) on the bits the rule gives
    it, against weight integers of at most 2**b: the products' magnitudes sum to <= 2**53."""
    b = exact.weight_bits(k)
    assert b == min(24, 53 - 24 - math.ceil(math.log2(max(k, 1))) + exact.WEIGHT_HEADROOM)
    x = torch.full((1, k), 1 - 2**-24)
    bits = expected_activation_bits(x, b)[0]
    step = Fraction(1, 2**bits)  # the grid of a row whose top power of two is 1
    magnitudes = sum(abs(v) / step for v in fraction_rows(x, [bits])[0])
    assert magnitudes * 2**b <= 2**53


def test_linear_is_exact_where_every_term_is_at_the_top_of_its_grid() -> None:
    """Flat rows: the activation gives up the bits its magnitudes need, and every product and
    partial sum is still exact (the rational sum, rounded once)."""
    k = 2048
    x = torch.full((2, k), 1 - 2**-24)
    w = torch.full((2, k), -(1 - 2**-24))
    x[1, ::2] = -x[1, ::2]
    b = exact.weight_bits(k)
    fw = exact.weight(w)
    assert fw.abs().max().item() == 1.0  # rounded up to the top of its grid
    bits = expected_activation_bits(x, b)
    assert bits[0] < 24
    assert exact.linear(x, fw).tolist() == exact_products(
        fraction_rows(x, bits), fraction_rows(w, [b, b])
    )


@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_result_depends_on_nothing_else(threads: int) -> None:
    """Row 0's product is the same alone, at any place among any number of rows (BLAS picks
    different kernels for different shapes), and on any thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = exact.weight(random_rows(3, (260, 128)))
        rows = random_rows(4, (300, 128))
        alone = exact.linear(rows[:1], w)[0]
        for m in (2, 3, 7, 16, 33, 64, 65, 300):
            batch = rows[:m].clone()
            for place in {0, m // 2, m - 1}:
                batch[[0, place]] = batch[[place, 0]]
                assert torch.equal(exact.linear(batch, w)[place], alone)
                batch[[0, place]] = batch[[place, 0]]
    finally:
        torch.set_num_threads(before)


def test_mean_square_is_exact_on_the_rows_grid() -> None:
    x = random_rows(5, (20, 128))
    fixed = exact.fixed_point(x, exact.bits_for(128))
    for i in range(20):
        total = sum(Fraction(v) ** 2 for v in fixed[i].tolist()) / 128
        want = torch.tensor(float(total), dtype=torch.float64).float().item()
        assert exact.mean_square(x[i : i + 1]).item() == want
        assert exact.mean_square(x)[i].item() == exact.mean_square(x[i : i + 1]).item()


def test_vectorized_elementwise_functions_do_not_depend_on_the_tensors_size() -> None:
    x = random_rows(6, (70_001,))
    for fn in (torch.ops.aten.silu, torch.exp, torch.sigmoid):
        whole = exact.vectorized(fn, x)
        torch.testing.assert_close(whole, fn(x), rtol=1e-6, atol=1e-7)
        for start, size in ((0, 1), (5, 33), (64, 1000), (70_000, 1), (1234, 40_000)):
            part = exact.vectorized(fn, x[start : start + size])
            assert torch.equal(part, whole[start : start + size])


def test_vectorized_has_the_functions_own_gradient() -> None:
    x = random_rows(11, (3, 1000)).requires_grad_()
    upstream = random_rows(12, (3, 1000))
    for fn, derivative in ((torch.ops.aten.silu, F.silu), (torch.exp, torch.exp)):
        value = exact.vectorized(fn, x)
        assert torch.equal(value, exact.vectorized(fn, x.detach()))
        (got,) = torch.autograd.grad(value, x, upstream)
        (want,) = torch.autograd.grad(derivative(x), x, upstream)
        assert torch.equal(got, want)


def test_prefix_sum_is_left_to_right_and_padding_changes_nothing() -> None:
    x = random_rows(7, (4, 37))
    for row in range(4):
        running = 0.0
        for v in x[row].tolist():
            running += v  # float64, left to right: what torch.cumsum does on the CPU
        assert exact.prefix_sum(x[row]).item() == torch.tensor(running).float().item()
    padded = F.pad(x, (0, 91))
    assert torch.equal(exact.prefix_sum(padded), exact.prefix_sum(x))


def test_log_softmax_is_the_float64_one_and_its_rows_do_not_depend_on_the_others() -> None:
    logits = random_rows(8, (200, 260), spread=1.0) * 3
    alone = torch.cat([exact.log_softmax(logits[i : i + 1]) for i in range(200)])
    for rows in (2, 7, 31, 64, 65, 200):
        assert torch.equal(exact.log_softmax(logits[:rows]), alone[:rows])
    assert torch.equal(exact.log_softmax(logits.view(8, 25, 260)).view(200, 260), alone)
    wide = logits.double()
    reference = (wide - torch.logsumexp(wide, -1, keepdim=True)).float()
    ulp = torch.finfo(torch.float32).eps * reference.abs().clamp(min=1.0)
    assert ((alone - reference).abs() <= ulp).all()
    masked = logits[:3].masked_fill(logits[:3] < 0, float("-inf"))
    assert torch.equal(exact.log_softmax(masked).isinf(), masked.isinf())


def test_log_softmax_at_an_index_is_the_whole_log_softmax_gathered() -> None:
    logits = random_rows(10, (50, 260), spread=1.0) * 3
    logits[:5] = logits[:5].masked_fill(logits[:5] < 0, float("-inf"))
    index = torch.randint(0, 260, (50, 3), generator=torch.Generator().manual_seed(1))
    want = exact.log_softmax(logits).gather(-1, index)
    assert torch.equal(exact.log_softmax_at(logits, index), want)
    wide = logits.double()
    reference = (wide - torch.logsumexp(wide, -1, keepdim=True)).float().gather(-1, index)
    finite = reference.isfinite()
    ulp = torch.finfo(torch.float32).eps * reference[finite].abs().clamp(min=1.0)
    assert ((want[finite] - reference[finite]).abs() <= ulp).all()


def test_log_softmax_has_torchs_gradient() -> None:
    logits = random_rows(9, (4, 260), spread=1.0).requires_grad_()
    weights = torch.linspace(-1, 1, 260)
    (exact.log_softmax(logits) * weights).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    (logits.log_softmax(-1) * weights).sum().backward()
    assert torch.equal(ours, logits.grad)


def test_fixed_point_is_the_float64_rounding_on_the_rows_grid() -> None:
    """fixed_point scales and rounds in float32; each row is the float64 round(x * 2**e) / 2**e
    on its grid, also for rows of huge (below 2**127), tiny, zero and subnormal values and -0.0."""
    x = random_rows(7, (64, 96), spread=0.25)
    x[0] = 0.0
    x[1, :3] = torch.tensor([1.0e38, -1.0e-38, 1.0e-45])
    x[2] *= 2.0**-110
    x[3, :2] = torch.tensor([-0.0, 2.0**30])
    for bits in (12, 21, 24):
        largest = x.abs().amax(-1, keepdim=True).double()
        exponent = torch.frexp(largest).exponent.double().clamp(min=-98)
        up = 2.0 ** (bits - exponent)
        expected = torch.round(x.double() * up) / up
        got = exact.fixed_point(x, bits)
        assert got.dtype == torch.float64
        assert torch.equal(got.view(torch.int64), expected.view(torch.int64))
