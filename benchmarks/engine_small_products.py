"""A decode step's weight products at SmolLM2-135M's shapes, side by side: float64 BLAS over
float64 weights (the engine before `products`), the compiled small product over float32
weights, and its eager stand-in; the weights cycled through copies larger than the CPU's cache,
as a step reads them, and the step's total (30 layers and the head).

    python benchmarks/engine_small_products.py [--rows 1,8,16] [--threads 1] [--seconds 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from whitney.local.engine import exact, products

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
HEAD, LAYERS = (49152, 576), 30
COLD = 200 << 20  # bytes of float64 copies of a weight cycled through: beyond the caches


def blas(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.matmul(x, w.t()).float()


def median_ms(fn, x: torch.Tensor, weights: list[torch.Tensor], seconds: float) -> float:
    fn(x, weights[0])
    times, index, end = [], 0, time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        w = weights[index % len(weights)]
        index += 1
        start = time.perf_counter()
        fn(x, w)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as directory:
        products.build(Path(directory))
        reason = products.load(Path(directory))
    if reason is not None:
        raise SystemExit(reason)
    rows = [int(m) for m in args.rows.split(",")]
    totals: dict[tuple[int, str], float] = {}
    gen = torch.Generator().manual_seed(0)
    for name, (n, k) in {**SHAPES, "head": HEAD}.items():
        copies = max(2, COLD // (n * k * 8))
        stored = [exact.weight(torch.randn(n, k, generator=gen) * 0.05) for _ in range(copies)]
        wide = [w.double() for w in stored]
        for m in rows:
            x = exact.activation_rows(torch.randn(m, k, generator=gen), exact.weight_bits(k))
            want = torch.matmul(x, wide[0].t()).float()
            for candidate in (products.compiled, products.eager):
                if not torch.equal(
                    candidate(x, stored[0]).view(torch.int32), want.view(torch.int32)
                ):
                    raise SystemExit(f"{name} {m} rows: bits differ from float64 BLAS")
            found = {
                "float64 BLAS": median_ms(blas, x, wide, args.seconds),
                "compiled f32": median_ms(products.compiled, x, stored, args.seconds),
                "eager f32": median_ms(products.eager, x, stored, args.seconds),
            }
            times = 1 if name == "head" else LAYERS
            for key, ms in found.items():
                totals[(m, key)] = totals.get((m, key), 0.0) + ms * times
            print(
                f"{name:8s} {n}x{k} rows {m:3d}: "
                + ", ".join(f"{key} {ms:.3f} ms" for key, ms in found.items()),
                flush=True,
            )
        del stored, wide
    for m in rows:
        base = totals[(m, "float64 BLAS")]
        line = ", ".join(
            f"{key} {totals[(m, key)]:.1f} ms ({totals[(m, key)] / base:.2f}x)"
            for key in ("float64 BLAS", "compiled f32", "eager f32")
        )
        print(f"a step's products, {m} rows, {args.threads} thread(s): {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
