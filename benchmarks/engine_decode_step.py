"""One decode step of the engine in-process: 8 rows over `--cached` positions of SmolLM2, its
compiled kernels loaded first; the minimum and median of `--steps` steps and a hash of the
logits (the same bits every step, and in every tree that keeps the engine's numbers).

    python benchmarks/engine_decode_step.py [--model gguf/SmolLM2-135M-Instruct-Q4_1]
                                            [--steps 30] [--threads 2] [--cached 90]

To compare two engines, run it from each tree alternately (an older tree: copy this script
into its `benchmarks/`), with `PYTHONPATH` set to that tree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time

import torch

from whitney.local.engine import EngineRun, kernels
from whitney.local.engine.model import KVCache

ROWS = 8


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gguf/SmolLM2-135M-Instruct-Q4_1")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cached", type=int, default=90, help="positions in the cache")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"compiled kernels: {kernels.STATE.wait()}", flush=True)
    run = EngineRun.create(base_model=args.model, lora_rank=8, seed=0)
    run.save_weights_for_sampler("bench")
    model = run.sampler_model("bench")
    torch.set_grad_enabled(False)
    cache = KVCache(model.cfg, ROWS, args.cached + 70)
    prompt = torch.randint(
        3, 40000, (ROWS, args.cached), generator=torch.Generator().manual_seed(0)
    )
    model.hidden(prompt, cache)
    token = prompt[:, :1]

    def step() -> torch.Tensor:
        logits = model.logits(model.hidden(token, cache)[:, -1])
        cache.positions -= 1
        return logits

    first = step()
    times = []
    for index in range(args.steps):
        start = time.perf_counter()
        logits = step()
        times.append(time.perf_counter() - start)
        if not torch.equal(logits, first):
            raise SystemExit(f"step {index}: the logits changed between identical steps")
        print(f"step {index + 1}/{args.steps}: {times[-1] * 1000:.1f} ms", flush=True)
    digest = hashlib.sha256(first.numpy().tobytes()).hexdigest()[:16]
    result = {"min_ms": min(times) * 1000, "median_ms": statistics.median(times) * 1000}
    print(json.dumps({**result, "logits": digest}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
