"""The engine's own exp, log and sqrt (`exact.exp`, `exact.log`, `exact.sqrt_float32`) against
references written here: Python's math (libm, not guaranteed correctly rounded: within 1 ulp),
mpmath at 120 bits (under 1 ulp), numpy's float32 sqrt (the hardware's, correctly rounded: equal
on millions of inputs); their ends and special values; each element's bits independent of the
tensor's length; the compiled kernels the eager functions' bits on all of these inputs."""

from __future__ import annotations

import math
import os
import shutil

import mpmath
import numpy as np
import pytest
import torch

from whitney.local.engine import exact, kernels

LENGTHS = (0, 1, 63, 64, 65)


def uniform(seed: int, n: int, low: float, high: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=gen, dtype=torch.float64) * (high - low) + low


def ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """How many float64 steps apart (same-signed finite values)."""
    return (got.view(torch.int64) - want.view(torch.int64)).abs()


def exp_inputs() -> torch.Tensor:
    """The engine's range (a row less its max: <= 0), the losses' ratios (|x| <= 20), and the
    rest of the domain up to overflow."""
    return torch.cat(
        [
            uniform(1, 200_000, exact.EXP_LOW, 0.0),
            uniform(2, 100_000, -20.0, 20.0),
            uniform(3, 50_000, -1e-3, 1e-3),
            uniform(4, 50_000, 0.0, exact.EXP_HIGH),
        ]
    )


def test_exp_is_within_one_ulp_of_libm() -> None:
    x = exp_inputs()
    want = torch.tensor([math.exp(v) for v in x.tolist()], dtype=torch.float64)
    assert int(ulps(exact.exp(x), want).max()) <= 1


def test_exp_is_under_one_ulp_of_mpmath() -> None:
    mpmath.mp.prec = 120
    x = exp_inputs()[::40]
    for value, got in zip(x.tolist(), exact.exp(x).tolist(), strict=True):
        true = mpmath.exp(value)
        assert abs(mpmath.mpf(got) - true) < math.ulp(float(true)), value


def near_a_float32_midpoint(value: float) -> bool:
    """Whether `value` lies within 2**-29 (relative) of a point halfway between float32s, where
    libm's last bit could round either way."""
    rounded = np.float32(value)
    for neighbour in (np.nextafter(rounded, np.float32(np.inf)), np.nextafter(rounded, 0)):
        midpoint = (float(rounded) + float(neighbour)) / 2
        if abs(value - midpoint) <= 2.0**-29 * abs(value):
            return True
    return False


def test_float32_exp_is_libms_rounded_to_float32() -> None:
    x = torch.cat([uniform(5, 200_000, -104.0, 89.0), uniform(6, 50_000, -20, 20)]).float()
    got = exact.exp_float32(x).numpy()
    checked = 0
    with np.errstate(over="ignore"):
        for value, mine in zip(x.tolist(), got.tolist(), strict=True):
            reference = math.exp(value) if value < 709 else math.inf
            if near_a_float32_midpoint(reference):
                continue
            checked += 1
            assert mine == float(np.float32(reference)), value
    assert checked > 0.9 * len(x)  # about 2 * 2**-29 / 2**-24 of them are left out


def log_inputs() -> torch.Tensor:
    """The normaliser's sums (in [1, vocabulary]), near 1, and every exponent of float64."""
    gen = torch.Generator().manual_seed(7)
    bits = torch.randint(1, 0x7FF0000000000000, (100_000,), generator=gen, dtype=torch.int64)
    return torch.cat(
        [uniform(8, 200_000, 1.0, 49152.0), uniform(9, 50_000, 0.5, 2.0), bits.view(torch.float64)]
    )


def test_log_is_within_one_ulp_of_libm() -> None:
    x = log_inputs()
    want = torch.tensor([math.log(v) for v in x.tolist()], dtype=torch.float64)
    got = exact.log(x)
    same_sign = (got.view(torch.int64) >= 0) == (want.view(torch.int64) >= 0)
    assert bool(same_sign[want != 0].all())
    assert int(ulps(got, want)[want != 0].max()) <= 1
    assert bool((got[want == 0] == 0).all())


def test_log_is_under_one_ulp_of_mpmath() -> None:
    mpmath.mp.prec = 120
    x = log_inputs()[::100]
    for value, got in zip(x.tolist(), exact.log(x).tolist(), strict=True):
        true = mpmath.log(value)
        if true != 0:
            assert abs(mpmath.mpf(got) - true) < math.ulp(float(true)), value


def float32_roots_inputs() -> torch.Tensor:
    """Millions of float32s: random bits of every exponent (subnormals too), exact squares of
    float32s of up to 12 bits and their neighbours, and 0, 1, inf."""
    gen = torch.Generator().manual_seed(10)
    bits = torch.randint(0, 0x7F800000, (3_000_000,), generator=gen, dtype=torch.int32)
    roots = torch.randint(1, 2**12, (200_000,), generator=gen).float()
    scales = (2.0 ** torch.randint(-70, 50, (200_000,), generator=gen)).float()
    squares = (roots * scales) ** 2  # at most 24 bits: exact
    steps = squares.view(torch.int32)
    neighbours = torch.cat([steps - 1, steps + 1]).view(torch.float32)
    ends = torch.tensor([0.0, 2.0**-149, 2.0**-126, 1.0, 4.0, 3.4028234663852886e38, math.inf])
    return torch.cat([bits.view(torch.float32), squares, neighbours, ends])


def test_float32_sqrt_is_numpys_correctly_rounded_root() -> None:
    x = float32_roots_inputs()
    got = exact.sqrt_float32(x).numpy().view(np.int32)
    assert np.array_equal(got, np.sqrt(x.numpy()).view(np.int32))


def test_special_values_and_the_domains_ends() -> None:
    inf, nan = math.inf, math.nan
    ends = [nan, -inf, inf, 0.0, -0.0, exact.EXP_LOW, exact.EXP_LOW - 1e-9, 720.0]
    got = exact.exp(torch.tensor(ends, dtype=torch.float64)).tolist()
    assert math.isnan(got[0]) and got[1:5] == [0.0, inf, 1.0, 1.0]
    assert got[5] == pytest.approx(math.exp(exact.EXP_LOW), rel=2e-16) and got[5] > 2.0**-1022
    assert got[6:] == [0.0, inf]
    assert exact.exp(torch.tensor([exact.EXP_HIGH], dtype=torch.float64)).item() < inf
    got32 = exact.exp_float32(torch.tensor([nan, -inf, inf, -104.0, 89.0])).tolist()
    assert math.isnan(got32[0]) and got32[1:] == [0.0, inf, 0.0, inf]
    positive = [nan, -1.0, 0.0, -0.0, inf, 1.0, 5e-324]
    logs = exact.log(torch.tensor(positive, dtype=torch.float64)).tolist()
    assert math.isnan(logs[0]) and math.isnan(logs[1])
    assert logs[2:6] == [-inf, -inf, inf, 0.0]
    assert logs[6] == pytest.approx(math.log(5e-324), rel=1e-15)
    roots = exact.sqrt_float32(torch.tensor([nan, -1.0, 0.0, -0.0, inf])).tolist()
    assert math.isnan(roots[0]) and math.isnan(roots[1])
    assert roots[2:] == [0.0, 0.0, inf] and math.copysign(1, roots[3]) == -1


@pytest.mark.parametrize("length", LENGTHS)
def test_each_elements_bits_do_not_depend_on_the_length(length: int) -> None:
    x64 = uniform(11, 65, -30.0, 5.0)
    positive = uniform(12, 65, 1.0, 500.0)
    x32 = x64.float()
    for fn, x in (
        (exact.exponential, x64),
        (exact.exponential, x32),
        (exact.square_root, x32.abs()),
        (exact.log, positive),
    ):
        whole = fn(x)
        part = fn(x[:length].contiguous())
        assert part.shape == (length,)
        assert torch.equal(part, whole[:length])
        assert torch.equal(fn(x.view(5, 13))[:, :3], whole.view(5, 13)[:, :3])


def test_exponential_and_square_root_have_the_functions_gradients() -> None:
    x = uniform(13, 100, -5.0, 5.0).float().requires_grad_()
    grad = uniform(14, 100, -1.0, 1.0).float()
    value = exact.exponential(x)
    (got,) = torch.autograd.grad(value, x, grad)
    assert torch.equal(got, grad * value.detach())
    root = exact.square_root(x.abs())
    (got,) = torch.autograd.grad(root, x, grad)
    assert torch.equal(got, grad / (2 * root.detach()) * x.detach().sign())


@pytest.mark.timeout(1800)  # the kernels may compile cold, on a busy machine
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
@pytest.mark.skipif(os.environ.get(kernels.COMPILE_ENV, "1") == "0", reason="kernels off")
def test_compiled_kernels_give_the_eager_functions_bits() -> None:
    assert kernels.STATE.wait()
    x64 = exp_inputs()
    x32 = torch.cat([x64.float(), uniform(5, 100_000, -104.0, 89.0).float()])
    roots = float32_roots_inputs()
    logits = uniform(15, 40 * 300, -60.0, 20.0).view(40, 300).float()
    grid = exact.power(40, torch.float64)
    for kernel, args in (
        (exact.EXP, (x64,)),
        (exact.EXP_FLOAT32, (x32,)),
        (exact.SQRT, (roots,)),
        (exact.LOG_SHIFTED_TOTAL, (logits, logits.amax(-1, keepdim=True), grid)),
    ):
        assert kernel.run is not None
        (compiled,) = kernel.run(list(args))
        assert kernels.same_bits(compiled, kernel.eager(*args))
