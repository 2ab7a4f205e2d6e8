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
widened to float64 in blocks of `BLOCK` rows (small enough to stay in the CPU's cache) for BLAS.

A decode step's attention over a KV cache stored as float32 (`model.KVCache`) runs the same way:
its queries (fixed-point rows) times the cached keys and its weights' parts times the cached
values are exact sums of exact products (`model.attention_weights_times_values`' bound), the
cache widened in registers by the compiled kernel (`attention_scores`, `attention_sums`) or, for
more than `SMALL_QUERIES` rows or without it, to a float64 copy for BLAS."""

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

// the attention's products: vectors of 4 (AVX2's width; 8 ran 3x slower there)
typedef double double4 __attribute__((vector_size(32)));
typedef float float4 __attribute__((vector_size(16)));

static inline double4 widened(const float* p) {
  float4 part;
  std::memcpy(&part, p, sizeof part);
  return __builtin_convertvector(part, double4);
}

static inline double4 loaded(const double* p) {
  double4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// raw [N, M, T] = q [N, M, K] float64 . keys [N, T, K] float32 (rows of stride kt, batches of
// stride kn), every sum exact (see products.py)
torch::Tensor cache_scores(torch::Tensor q, torch::Tensor keys) {
  TORCH_CHECK(q.dtype() == torch::kFloat64 && keys.dtype() == torch::kFloat32, "dtypes");
  TORCH_CHECK(q.is_contiguous() && keys.stride(2) == 1 && q.size(2) == keys.size(2), "shapes");
  const int64_t N = q.size(0), M = q.size(1), K = q.size(2), T = keys.size(1);
  const int64_t kn = keys.stride(0), kt = keys.stride(1);
  auto raw = torch::empty({N, M, T}, torch::kFloat64);
  const double* Q = q.data_ptr<double>();
  const float* KEYS = keys.data_ptr<float>();
  double* R = raw.data_ptr<double>();
  at::parallel_for(0, N, 1, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; n++) {
      for (int64_t t = 0; t < T; t++) {
        const float* key = KEYS + n * kn + t * kt;
        for (int64_t m = 0; m < M; m++) {
          const double* x = Q + (n * M + m) * K;
          double4 even = {}, odd = {};
          int64_t k = 0;
          for (; k + 8 <= K; k += 8) {
            even += loaded(x + k) * widened(key + k);
            odd += loaded(x + k + 4) * widened(key + k + 4);
          }
          for (; k + 4 <= K; k += 4) even += loaded(x + k) * widened(key + k);
          const double4 sum = even + odd;
          double s = (sum[0] + sum[1]) + (sum[2] + sum[3]);
          for (; k < K; k++) s += x[k] * (double)key[k];
          R[(n * M + m) * T + t] = s;
        }
      }
    }
  });
  return raw;
}

// both [N, M, 2D] = hi [N, M, T] @ values [N, T, 2D] float32 (rows of stride vt, batches of
// stride vn) and cross [N, M, D] = lo @ values[..., :D], every sum exact (see products.py): 4
// columns of up to 4 rows at a time, summed over every key in registers
std::vector<torch::Tensor> cache_weighted(torch::Tensor hi, torch::Tensor lo,
                                          torch::Tensor values) {
  TORCH_CHECK(hi.dtype() == torch::kFloat64 && lo.dtype() == torch::kFloat64, "dtypes");
  TORCH_CHECK(values.dtype() == torch::kFloat32, "dtypes");
  TORCH_CHECK(hi.is_contiguous() && lo.is_contiguous() && values.stride(2) == 1, "shapes");
  TORCH_CHECK(hi.sizes() == lo.sizes() && hi.size(2) == values.size(1), "shapes");
  const int64_t N = hi.size(0), M = hi.size(1), T = hi.size(2), D = values.size(2) / 2;
  const int64_t vn = values.stride(0), vt = values.stride(1);
  auto both = torch::empty({N, M, 2 * D}, torch::kFloat64);
  auto cross = torch::empty({N, M, D}, torch::kFloat64);
  const double* H = hi.data_ptr<double>();
  const double* L = lo.data_ptr<double>();
  const float* V = values.data_ptr<float>();
  double* BOTH = both.data_ptr<double>();
  double* CROSS = cross.data_ptr<double>();
  at::parallel_for(0, N, 1, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; n++) {
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const int64_t rows = std::min<int64_t>(4, M - m0);
        const double* h = H + (n * M + m0) * T;
        const double* l = L + (n * M + m0) * T;
        for (int64_t k = 0; k < D; k += 4) {
          const int64_t width = std::min<int64_t>(4, D - k);
          double4 coarse_sums[4] = {}, fine_sums[4] = {}, cross_sums[4] = {};
          for (int64_t t = 0; t < T; t++) {
            const float* v = V + n * vn + t * vt;
            double4 coarse = {}, fine = {};
            if (width == 4) {
              coarse = widened(v + k);
              fine = widened(v + D + k);
            } else {
              for (int64_t c = 0; c < width; c++) {
                coarse[c] = v[k + c];
                fine[c] = v[D + k + c];
              }
            }
            for (int64_t r = 0; r < rows; r++) {
              coarse_sums[r] += h[r * T + t] * coarse;
              fine_sums[r] += h[r * T + t] * fine;
              cross_sums[r] += l[r * T + t] * coarse;
            }
          }
          for (int64_t r = 0; r < rows; r++) {
            double* b = BOTH + (n * M + m0 + r) * 2 * D;
            double* c = CROSS + (n * M + m0 + r) * D;
            for (int64_t j = 0; j < width; j++) {
              b[k + j] = coarse_sums[r][j];
              b[D + k + j] = fine_sums[r][j];
              c[k + j] = cross_sums[r][j];
            }
          }
        }
      }
    }
  });
  return {both, cross};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("product", &product);
  m.def("cache_scores", &cache_scores);
  m.def("cache_weighted", &cache_weighted);
}
"""
FLAGS = {"AVX512": ["-mavx512f", "-mavx2", "-mfma"], "AVX2": ["-mavx2", "-mfma"]}
"""The vector instructions the source is built for, by torch's CPU capability (the kernel's
cache is keyed by it); any of them gives the same bits."""

SMALL_QUERIES = 16
"""Query rows per key-value head up to which the compiled attention products run (a decode step's
heads that share a key-value head)."""
compiled: Callable[[Tensor, Tensor], Tensor] | None = None
compiled_scores: Callable[[Tensor, Tensor], Tensor] | None = None
compiled_weighted: Callable[[Tensor, Tensor, Tensor], list[Tensor]] | None = None
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


def attention_scores(q: Tensor, keys: Tensor) -> Tensor:
    """Queries [B, kv, M, K] (float64, fixed-point rows) times keys [B, kv, T, K] (float32 or
    float64), transposed: the exact scores [B, kv, M, T] (float64)."""
    run = compiled_scores
    if keys.dtype == torch.float32 and run is not None and q.shape[2] <= SMALL_QUERIES:
        raw = run(q.flatten(0, 1).contiguous(), keys.flatten(0, 1))
        return raw.view(*q.shape[:-1], keys.shape[2])
    return torch.matmul(q, keys.double().transpose(-1, -2))


def attention_sums(hi: Tensor, lo: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Weights' parts hi and lo [B, kv, M, T] (float64) times values [B, kv, T, 2 D] (float32
    or float64: two parts side by side): hi times both parts [B, kv, M, 2 D] and lo times the
    first [B, kv, M, D], exact (float64)."""
    run = compiled_weighted
    if values.dtype == torch.float32 and run is not None and hi.shape[2] <= SMALL_QUERIES:
        both, cross = run(
            hi.flatten(0, 1).contiguous(), lo.flatten(0, 1).contiguous(), values.flatten(0, 1)
        )
        return both.view(*hi.shape[:-1], -1), cross.view(*hi.shape[:-1], -1)
    wide = values.double()
    return torch.matmul(hi, wide), torch.matmul(lo, wide[..., : wide.shape[-1] // 2])


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


def cache_examples() -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """Queries [B, kv, M, d], weights' parts hi and lo [B, kv, M, T] and caches [B, kv, T, 3 d]
    (float32, a slice of a longer cache as `model.KVCache` reads it) to check the attention
    products on: random, odd sizes (vector tails), and every element at full bits."""
    gen = torch.Generator().manual_seed(0)
    found = []
    for b, kv, m, t, d in (
        (1, 1, 1, 1, 8),
        (2, 3, 3, 13, 64),
        (3, 2, 1, 40, 32),
        (1, 2, 16, 9, 21),
    ):
        q = (torch.randint(-(2**23), 2**23, (b, kv, m, d), generator=gen) * 2.0**-20).double()
        parts = torch.randint(0, 2**23, (2, b, kv, m, t), generator=gen).double() * 2.0**-23
        cache = torch.randint(-(2**21), 2**21, (b, kv, t + 5, 3 * d), generator=gen) * 2.0**-30
        found.append((q, parts[0], parts[1], cache.float()[:, :, :t]))
    full = 2.0**24 - 1  # at full bits, 31 terms: (2**24 - 1)**2 * 31 < 2**53
    q = torch.full((1, 2, 3, 31), full, dtype=torch.float64)
    cache = torch.full((1, 2, 31, 93), -full)
    q[:, :, 1, ::2] *= -1
    cache[:, 1, 1::3] *= -1
    found.append((q, q[..., :31].clone(), -q[..., :31], cache))
    return found


def attention_bits_differ(module) -> bool:
    """Whether the compiled attention products of `module` give other bits than float64 BLAS's
    on `cache_examples`."""
    for q, hi, lo, cache in cache_examples():
        d = q.shape[-1]
        wide = cache.double()
        want = (
            torch.matmul(q, wide[..., :d].transpose(-1, -2)),
            torch.matmul(hi, wide[..., d:]),
            torch.matmul(lo, wide[..., d : 2 * d]),
        )
        raw = module.cache_scores(q.flatten(0, 1), cache[..., :d].flatten(0, 1))
        both, cross = module.cache_weighted(
            hi.flatten(0, 1).contiguous(),
            lo.flatten(0, 1).contiguous(),
            cache[..., d:].flatten(0, 1),
        )
        for got, expected in zip((raw, both, cross), want, strict=True):
            if not torch.equal(
                got.view(expected.shape).view(torch.int64), expected.view(torch.int64)
            ):
                return True
    return False


def load(directory: Path) -> str | None:
    """Load the kernel from `directory` and check it bit for bit against float64 BLAS on
    `examples`; None if loaded, else why not."""
    global compiled, compiled_scores, compiled_weighted
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
    if attention_bits_differ(module):
        return "the compiled attention products' bits differed from float64 BLAS's"
    compiled = module.product
    compiled_scores, compiled_weighted = module.cache_scores, module.cache_weighted
    return None
