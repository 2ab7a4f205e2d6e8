"""A few rows times a weight stored as float32 (`exact.weight`), exact: a decode step's products.

Every operand is a fixed-point row (`exact.activation_rows`: at most 24 bits; `exact.weight`:
at most `weight_bits(K)` <= 24 bits, so the weight is exact in float32, half float64's bytes).
Each product of a 24-bit and a <= 24-bit integer is exact in float64, and every partial sum is
an integer below 2**53 in units of its output's step (the bound in `activation_rows`), so the
float64 sum is exact in any order, with or without fused multiply-adds: the compiled kernel,
its eager stand-in and a float64 BLAS product over the same operands give the same sum, which
is then rounded once to float32. The compiled kernel (C++ built by the kernels' child into the
user's cache, `kernels.py`) spreads tiles of 48 weight rows over torch's threads and reads each tile
from memory once: 8 rows of x at a time (4 without AVX-512) multiply it, 3 weight rows at a time
widened to float64 in registers, while it stays in the CPU's cache; without it, the weight is
widened to float64 in blocks of `BLOCK` rows (small enough to stay in the CPU's cache) for BLAS."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import threading
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

SMALL = 16 if torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX2") else 1
"""Rows up to which the compiled kernel is used: 16 with AVX-512 or AVX2, where its accumulators
fit the vector registers and it was faster than `eager` up to 16 rows
(docs/measured.md#engine-small-products-rows, #engine-small-products-avx2-tile); one without."""
BLOCK = 1024
"""Weight rows widened to float64 at a time by the eager product."""
NAME = "whitney_small_products"
UNBUILT = "unbuilt.txt"
"""Written by `build` in place of the kernel where it could not be built: why."""
SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cstring>
#include <utility>

// a pass's sums[3][ROWS] in vector registers: 24 of 32 with AVX-512, 12 of 16 with AVX2
#if defined(__AVX512F__)
constexpr int64_t LANES = 8, ROWS = 8;
#else
constexpr int64_t LANES = 4, ROWS = 4;
#endif
constexpr int64_t TILE = 48, DEPTH = 512;

typedef double wide __attribute__((vector_size(LANES * sizeof(double))));

// w[0:LANES] as float64, one vcvtps2pd (GCC 12 splits __builtin_convertvector's into halves)
template <std::size_t... L>
static inline wide widen(const float* w, std::index_sequence<L...>) { return wide{w[L]...}; }

// acc[b][a] += x[b, k0:k1] . w[n + a, k0:k1] for `rows` rows of x and NN rows of w
template <int NN>
static void tile(const double* x, const float* w, double acc[][TILE], int64_t rows, int64_t K,
                 int64_t n, int64_t a0, int64_t k0, int64_t k1) {
  wide sums[NN][ROWS] = {};
  int64_t k = k0;
  for (; k + LANES <= k1; k += LANES) {
    wide wv[NN];
    for (int a = 0; a < NN; a++)
      wv[a] = widen(w + (n + a) * K + k, std::make_index_sequence<LANES>());
    for (int b = 0; b < ROWS; b++) {
      if (b >= rows) break;
      wide xv;
      std::memcpy(&xv, x + b * K + k, sizeof xv);
      for (int a = 0; a < NN; a++) sums[a][b] += xv * wv[a];
    }
  }
  for (int a = 0; a < NN; a++) {
    for (int64_t b = 0; b < rows; b++) {
      double s = 0.0;
      for (int l = 0; l < LANES; l++) s += sums[a][b][l];
      for (int64_t kk = k; kk < k1; kk++) s += x[b * K + kk] * (double)w[(n + a) * K + kk];
      acc[b][a0 + a] += s;
    }
  }
}

// y [M, N] float32 = x [M, K] float64 @ w [N, K] float32 .T, every sum exact (see products.py)
torch::Tensor product(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dtype() == torch::kFloat64 && w.dtype() == torch::kFloat32, "dtypes");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && x.size(1) == w.size(1), "shapes");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({M, N}, torch::kFloat32);
  const double* X = x.data_ptr<double>();
  const float* W = w.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, (N + TILE - 1) / TILE, 1, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; t++) {
      const int64_t n0 = t * TILE, n1 = std::min(N, n0 + TILE);
      for (int64_t m0 = 0; m0 < M; m0 += ROWS) {  // the tile's weight rows stay in cache meanwhile
        const int64_t rows = std::min<int64_t>(ROWS, M - m0);
        const double* xs = X + m0 * K;
        double acc[ROWS][TILE] = {};
        for (int64_t k0 = 0; k0 < K; k0 += DEPTH) {
          const int64_t k1 = std::min(K, k0 + DEPTH);
          int64_t n = n0;
          for (; n + 3 <= n1; n += 3) tile<3>(xs, W, acc, rows, K, n, n - n0, k0, k1);
          for (; n < n1; n++) tile<1>(xs, W, acc, rows, K, n, n - n0, k0, k1);
        }
        for (int64_t b = 0; b < rows; b++)
          for (int64_t n = n0; n < n1; n++) Y[(m0 + b) * N + n] = (float)acc[b][n - n0];
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("product", &product); }
"""
FLAGS = {"AVX512": ["-mavx512f", "-mavx2", "-mfma"], "AVX2": ["-mavx2", "-mfma"]}
"""The vector instructions the source is built for, by torch's CPU capability (the kernel's
cache is keyed by it); any of them gives the same bits."""

compiled: Callable[[Tensor, Tensor], Tensor] | None = None
SCRATCH = threading.local()


def scratch(name: str, numel: int) -> Tensor:
    """This thread's float64 buffer `name` of at least `numel` elements: no allocation (and
    page faults) a block."""
    buffer = getattr(SCRATCH, name, None)
    if buffer is None or buffer.numel() < numel:
        with torch.inference_mode(False):
            buffer = torch.empty(numel, dtype=torch.float64)
            setattr(SCRATCH, name, buffer)
    return buffer[:numel]


def widened(w: Tensor) -> Tensor:
    """w as float64 in this thread's scratch buffer."""
    return scratch("weight", w.numel()).view(w.shape).copy_(w)


def eager(x: Tensor, w: Tensor) -> Tensor:
    """x [M, K] float64 @ w [N, K] float32 .T as float32: BLAS over blocks of widened rows, each
    block's exact sums (in a scratch buffer) rounded straight into its columns of the output."""
    rows = x.shape[0]
    out = torch.empty(rows, w.shape[0])
    for start in range(0, w.shape[0], BLOCK):
        block = widened(w[start : start + BLOCK])
        sums = scratch("sums", rows * block.shape[0]).view(rows, block.shape[0])
        torch.mm(x, block.t(), out=sums)
        out[:, start : start + block.shape[0]].copy_(sums)
    return out


def product(x: Tensor, w: Tensor) -> Tensor:
    """x [..., K] float64 @ w [N, K] float32 .T as float32, exact then rounded once: compiled
    for up to `SMALL` rows (when loaded), else `eager`."""
    rows = x.reshape(-1, x.shape[-1])
    run = compiled
    if run is not None and rows.shape[0] <= SMALL:
        out = run(rows.contiguous(), w)
    else:
        out = eager(rows, w)
    return out.view(*x.shape[:-1], w.shape[0])


def build(directory: Path) -> None:
    """Compile the kernel into `directory` (the kernels' child does, once per cache); where it
    cannot be (no ninja, no headers), write why there instead, for `load` to say."""
    from torch.utils.cpp_extension import load_inline

    build = directory / NAME
    build.mkdir(parents=True, exist_ok=True)
    flags = ["-O3", "-fopenmp", *FLAGS.get(torch.backends.cpu.get_cpu_capability(), [])]
    try:
        load_inline(NAME, SOURCE, extra_cflags=flags, build_directory=str(build))
    except Exception as error:  # noqa: BLE001 - the eager product runs, the same bits
        first = (str(error).strip().splitlines() or ["no message"])[0]
        (build / UNBUILT).write_text(
            f"the small product was not built ({first}); to build it, mend that and remove"
            f" {directory}"
        )


def examples() -> list[tuple[Tensor, Tensor]]:
    """Rows and weights to check the kernel on: random, and at the bound (every element at
    the top of its grid, many terms, mixed signs), odd sizes, one row to more than 16 (several
    blocks of 8 rows over a tile)."""
    gen = torch.Generator().manual_seed(0)
    found = []
    for m, n, k in ((1, 5, 7), (8, 49, 576), (11, 7, 1541), (19, 100, 600)):
        x = (torch.randint(-(2**23), 2**23, (m, k), generator=gen) * 2.0**-20).double()
        w = torch.randint(-(2**20), 2**20, (n, k), generator=gen).float() * 2.0**-26
        found.append((x, w))
    k = 2048  # the flattest rows the bound allows: 2**21 * 2**21 * 2048 = 2**53
    x = torch.full((3, k), 2.0**21, dtype=torch.float64)
    w = torch.full((5, k), -(2.0**21))
    x[1, ::2] *= -1
    w[2, 1::3] *= -1
    found.append((x, w))
    k = 31  # every element at full bits: (2**24 - 1)**2 * 31 < 2**53
    x = torch.full((9, k), 2.0**24 - 1, dtype=torch.float64)
    w = torch.full((4, k), 2.0**24 - 1)
    x[::2, 1::2] *= -1
    w[1] *= -1
    found.append((x, w))
    return found


def load(directory: Path) -> str | None:
    """Load the kernel from `directory` and check it bit for bit against float64 BLAS on
    `examples`; None if loaded, else why not."""
    global compiled
    path = directory / NAME / f"{NAME}.so"
    if not path.exists():
        why = directory / NAME / UNBUILT
        return why.read_text() if why.exists() else f"no compiled product at {path}"
    spec = importlib.util.spec_from_file_location(
        NAME, path, loader=importlib.machinery.ExtensionFileLoader(NAME, str(path))
    )
    if spec is None or spec.loader is None:
        return f"no compiled product at {path}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for x, w in examples():
        want = torch.matmul(x, w.double().t()).float()
        if not torch.equal(module.product(x, w).view(torch.int32), want.view(torch.int32)):
            return "the compiled small product's bits differed from float64 BLAS's"
    compiled = module.product
    return None
