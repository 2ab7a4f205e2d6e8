"""Where the engine's time goes: torch's profiler around one SmolLM2 forward_backward (cross
entropy) and one logprobs call of `--shape` tokens, each after `--warmups` unprofiled calls (the
last one timed), on `engine_vs_peft.py`'s engine side and tokens. Prints each call's wall time,
the products' share of it (`mm`, `addmm`, `addmm_`, `bmm`), `copy_`, the aten calls, the time
under no aten op (compiled kernels run outside an autograd function, and Python), and the ops of
most self time.

    python benchmarks/engine_profile.py [--model gguf/SmolLM2-135M-Instruct-Q4_1]
                                        [--shape 16x43] [--threads 2] [--warmups 2] [--top 12]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
from engine_vs_peft import EngineSide, shapes_of, token_batch
from torch.profiler import ProfilerActivity, profile

from whitney.local.model_pull import PULLABLE

PRODUCTS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm")


def profiled(name: str, call: Callable[[], None], warmups: int, top: int) -> None:
    """Run `call` `warmups` times, then once under the profiler; print where its time went."""
    for _ in range(warmups):
        start = time.perf_counter()
        call()
        unprofiled = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        call()
        wall = time.perf_counter() - start
    ops = [op for op in prof.key_averages() if op.key.startswith("aten::")]
    self_s = {op.key: op.self_cpu_time_total / 1e6 for op in ops}
    products = sum(self_s.get(key, 0.0) for key in PRODUCTS)
    copies = self_s.get("aten::copy_", 0.0)
    calls = sum(op.count for op in ops)
    outside = wall - sum(self_s.values())
    print(f"{name}: {wall:.2f} s profiled ({unprofiled:.2f} s unprofiled, the call before)")
    print(f"  products {products:.2f} s ({products / wall:.1%} of the wall time)")
    print(f"  copy_ {copies:.2f} s ({copies / wall:.1%}); {calls} aten calls")
    print(f"  under no aten op {outside:.2f} s ({outside / wall:.1%})")
    for key, seconds in sorted(self_s.items(), key=lambda item: -item[1])[:top]:
        print(f"    {key:32s} {seconds:7.3f} s {seconds / wall:6.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=PULLABLE["smollm2-135m-instruct"].repo_id)
    parser.add_argument("--hf-cache", default=os.environ.get("HF_HUB_CACHE"))
    parser.add_argument("--shape", default="16x43", help="sequences x tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmups", type=int, default=2)
    parser.add_argument("--top", type=int, default=12, help="ops of most self time to list")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    (batch_shape,) = shapes_of(args.shape)
    engine = EngineSide(args)
    batch = token_batch(*batch_shape, engine.vocab, seed=0)
    for kind in ("forward_backward", "logprobs"):
        profiled(
            f"{kind} {args.shape}",
            lambda kind=kind: engine.work(kind, batch),
            args.warmups,
            args.top,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
