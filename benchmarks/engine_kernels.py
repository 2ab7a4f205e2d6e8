"""Each compiled exact kernel against its eager function, at growing sizes: where the eager
call is the faster (a kernel's `eager_from`, the size from which the engine runs it eagerly).
Compiles the kernels first if the cache (`$XDG_CACHE_HOME/whitney-flows/inductor`) has none.

    python benchmarks/engine_kernels.py [--repeats 200] [--threads 2]

A kernel's first example grows along its first dimension (every argument of that size repeated
with it), so the shapes are the engine's own: rows of activations, attention's batches. Eager
and compiled calls are timed one after the other, each the median of 5 blocks of calls.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from whitney.local.engine import kernels


def grown(args: tuple, factor: int) -> tuple:
    """`args` with every tensor sized like the first argument's first dimension repeated."""
    rows = args[0].shape[0]
    return tuple(
        a.repeat(factor, *[1] * (a.dim() - 1)).contiguous() if a.dim() and a.shape[0] == rows else a
        for a in args
    )


def per_call(fn, args: tuple, repeats: int) -> float:
    """Seconds a call, median of 5 blocks of `repeats` calls."""
    fn(*args)
    blocks = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn(*args)
        blocks.append((time.perf_counter() - t0) / repeats)
    return statistics.median(blocks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    if not kernels.STATE.wait():
        print("no compiled kernels (see the engine's warning)")
        return 1
    print(f"kernels ready in {time.perf_counter() - t0:.1f} s")
    print(f"{'kernel':18} {'elements':>10} {'eager µs':>10} {'compiled µs':>12} {'ratio':>6}")
    for kernel in kernels.STATE.kernels:
        example = kernel.examples()[0]
        for factor in (1, 4, 16, 64, 256, 1024):
            made = grown(example, factor)
            compiled = kernel.run

            def run(*a, compiled=compiled):
                return compiled(list(a))

            eager = per_call(kernel.eager, made, max(args.repeats // factor, 5))
            fused = per_call(run, made, max(args.repeats // factor, 5))
            print(
                f"{kernel.eager.__name__:18} {made[0].numel():>10} {eager * 1e6:>10.1f} "
                f"{fused * 1e6:>12.1f} {fused / eager:>6.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
