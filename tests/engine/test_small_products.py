"""A decode step's products from weights stored as float32 (`products`): the compiled kernel,
its eager stand-in and float64 BLAS over the same operands give the same bits (every sum exact,
`products`' bound), on random rows and on rows at the bound; `exact.weight` stores float32
exactly where it can."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension
from torch.utils._cpp_extension_versioner import ExtensionVersioner

from whitney.local.engine import exact, kernels, products

from .test_exact import random_rows


def blas(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Today's product: float64 BLAS over the widened weight, rounded once."""
    return torch.matmul(x, w.double().t()).float()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def operands(seed: int, m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Activation rows and a stored weight as the engine makes them."""
    w = exact.weight(random_rows(seed, (n, k)))
    assert w.dtype == torch.float32
    return exact.activation_rows(random_rows(seed + 1, (m, k)), exact.weight_bits(k)), w


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory):
    """The kernel built and loaded from a fresh directory (as the kernels' child and this
    process do), or a skip where no C++ compiler is present."""
    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    directory: Path = tmp_path_factory.mktemp("products")
    names = ("compiled", "compiled_scores", "compiled_weighted")
    before = [getattr(products, name) for name in names]
    products.build(directory)
    assert products.load(directory) is None
    yield products.compiled
    for name, value in zip(names, before, strict=True):
        setattr(products, name, value)


@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_eager_and_float64_blas_give_the_same_bits(compiled, threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for m, n, k in (
            (1, 960, 576),
            (8, 577, 576),
            (9, 50, 1536),
            (17, 3, 40),
            (8, 1, 7),
            (32, 100, 576),
        ):
            x, w = operands(m * n + k, m, n, k)
            want = blas(x, w)
            assert torch.equal(bits(compiled(x, w)), bits(want))
            assert torch.equal(bits(products.eager(x, w)), bits(want))
    finally:
        torch.set_num_threads(before)


def test_the_same_bits_at_the_bound(compiled) -> None:
    """Rows whose every partial sum reaches the bound (2**53 in units of the output), mixed
    signs, many terms; and every element at full bits: still the exact sum, rounded once."""
    for x, w in products.examples():
        want = blas(x, w)
        assert torch.equal(bits(compiled(x, w)), bits(want))
        assert torch.equal(bits(products.eager(x, w)), bits(want))
    k = 2048
    x, w = torch.full((8, k), 2.0**21, dtype=torch.float64), torch.full((3, k), 2.0**21)
    assert compiled(x, w)[0, 0].item() == 2.0**53  # the largest exact sum, independently
    x[:, -1] = -(2.0**21)
    assert compiled(x, w)[0, 0].item() == 2.0**53 - 2.0**43


def test_exact_linear_with_a_float32_weight_is_the_float64_product() -> None:
    """`exact.weight` stores the fixed-point weight as float32 with the same values; `linear`
    over it gives float64 BLAS's bits at every row count (small ones compiled where loaded)."""
    w = random_rows(7, (300, 576))
    w[5] *= 2.0**-110  # a row at float32's smallest steps
    w[6] *= 2.0**-130
    stored = exact.weight(w)
    fixed = exact.fixed_point(w, exact.weight_bits(576))
    assert stored.dtype == torch.float32 and torch.equal(stored.double(), fixed)
    for m in (1, 8, 9, 64):
        x = random_rows(m, (m, 576))
        assert torch.equal(bits(exact.linear(x, stored)), bits(exact.linear(x, fixed)))


def test_without_ninja_the_product_runs_eager_and_says_why_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The kernels' child's build of the small product with a failing `ninja` first on PATH and
    an empty cache: it writes why instead of failing (the nine kernels stand alone), the
    loading process says that once, and the product stays eager with float64 BLAS's bits."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "ninja").write_text("#!/bin/sh\nexit 1\n")
    (tools / "ninja").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    # a fresh record of built extensions: an earlier build in this process renames the next one
    monkeypatch.setattr(cpp_extension, "JIT_EXTENSION_VERSIONER", ExtensionVersioner())
    monkeypatch.setattr(products, "compiled", None)
    directory = tmp_path / "cache"
    products.build(directory)
    assert not list(directory.rglob("*.so"))
    state = kernels.State()
    with caplog.at_level(logging.WARNING, logger="whitney.local.engine"):
        state.load_product(directory)
        state.load_product(directory)
    said = [r.getMessage() for r in caplog.records if "small product" in r.getMessage()]
    assert len(said) == 1 and "Ninja is required" in said[0], said
    assert f"mend that and remove {directory};" in said[0], said  # how to build it later
    assert products.compiled is None
    x, w = operands(3, 8, 200, 576)
    assert torch.equal(bits(products.product(x, w)), bits(blas(x, w)))


@pytest.mark.parametrize("threads", [1, 2])
def test_attention_products_over_a_float32_cache_are_float64_blas(compiled, threads: int) -> None:
    """Queries times cached keys and weights' parts times cached values (a float32 cache, a
    slice of a longer one): compiled (up to SMALL_QUERIES rows), eager and float64 BLAS over the
    float64 cache give the same bits, on random operands and at full bits."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        examples = products.cache_examples()
        q, hi, lo, cache = examples[1]
        examples.append((q.repeat(1, 1, 7, 1), hi.repeat(1, 1, 7, 1), lo.repeat(1, 1, 7, 1), cache))
        for q, hi, lo, cache in examples:
            d = q.shape[-1]
            wide = cache.double()
            want = [
                torch.matmul(q, wide[..., :d].transpose(-1, -2)),
                torch.matmul(hi, wide[..., d:]),
                torch.matmul(lo, wide[..., d : 2 * d]),
            ]
            for stored in (cache, wide):
                got = [
                    products.attention_scores(q, stored[..., :d]),
                    *products.attention_sums(hi, lo, stored[..., d:]),
                ]
                for a, b in zip(got, want, strict=True):
                    assert torch.equal(a.view(torch.int64), b.view(torch.int64))
    finally:
        torch.set_num_threads(before)
