"""Each compiled exact kernel against its eager function, at growing sizes: where the eager
call is the faster (a kernel's `eager_from`, the size from which the engine runs it eagerly).
Compiles the kernels first if the cache (`$XDG_CACHE_HOME/whitney-flows/inductor`) has none.

    python benchmarks/engine_kernels.py [--repeats 200] [--threads 2] [--rounds 5]

A kernel's first example grows along its first dimension (every argument of that size repeated
with it), so the shapes are the engine's own: rows of activations, attention's batches. Eager
and compiled blocks of calls alternate, `--rounds` of each; printed: the minimum and the median
block (on a busy machine the median shows what waiting for a descheduled thread costs: torch's
eager ops run on `--threads`, a compiled kernel on one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

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
    """Seconds a call, over one block of `repeats` calls."""
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn(*args)
    return (time.perf_counter() - t0) / repeats


def alternating(fns: dict[str, Callable], args: tuple, repeats: int, rounds: int) -> dict:
    """Each of `fns` called in blocks of `repeats`, the blocks alternating, `rounds` of each:
    {name: (minimum, median)} seconds a call."""
    for fn in fns.values():
        fn(*args)
    blocks: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            blocks[name].append(per_call(fn, args, repeats))
    return {name: (min(b), statistics.median(b)) for name, b in blocks.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    if not kernels.STATE.wait():
        print("no compiled kernels (see the engine's warning)")
        return 1
    print(f"kernels ready in {time.perf_counter() - t0:.1f} s")
    print(f"{'kernel':18} {'elements':>10} {'eager µs min/median':>22} {'compiled µs':>20}")
    for kernel in kernels.STATE.kernels:
        example = kernel.examples()[0]
        for factor in (1, 4, 16, 64, 256, 1024):
            made = grown(example, factor)
            compiled = kernel.run

            def run(*a, compiled=compiled):
                return compiled(list(a))

            both = {"eager": kernel.eager, "compiled": run}
            timed = alternating(both, made, max(args.repeats // factor, 5), args.rounds)
            (eager, eager_median), (fused, fused_median) = timed["eager"], timed["compiled"]
            print(
                f"{kernel.eager.__name__:18} {made[0].numel():>10} "
                f"{eager * 1e6:>10.1f}/{eager_median * 1e6:<11.1f} "
                f"{fused * 1e6:>9.1f}/{fused_median * 1e6:<10.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
