"""One RL cycle on the engine in-process: 8 prompts x 8 samples x 32 tokens sampled, then
forward_backward (importance_sampling) on the 64 sequences and optim_step. Measures this tree's
engine against a baseline commit's engine side by side, in alternating worker processes.

    python benchmarks/engine_cycle.py [--model local/tiny] [--cycles 10] [--rounds 3]
                                      [--baseline REF] [--threads 2]

The default baseline is the engine before it was made batch-invariant (plain torch matmuls
and SDPA, which give a sequence different last bits with different batch-mates). Each worker
also runs one cycle under torch's profiler and reports the time of its matrix products (and the
baseline's fused SDPA kernels): the baseline's cycle with its products swapped for this
engine's exact float64 ones is the least a cycle of exact products costs here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "d46887925e65214e083f05172c4923aea22b572d"  # the last commit of the previous engine
KINDS = ("sample", "forward_backward", "optim_step", "cycle")
PRODUCTS = {
    "aten::mm",
    "aten::bmm",
    "aten::addmm",
    "aten::baddbmm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
}
"""Profiler names of matrix products (SDPA's fused kernels counted whole, softmax and all)."""


def rl_payload(prompts: list[list[int]], results: list[dict], target: int) -> dict:
    """Importance-sampling datums; advantage = share of `target` bytes minus the group mean."""
    data = []
    for prompt, result in zip(prompts, results, strict=True):
        seqs = result["sequences"]
        rewards = [s["tokens"].count(target) / len(s["tokens"]) for s in seqs]
        mean = sum(rewards) / len(rewards)
        for seq, reward in zip(seqs, rewards, strict=True):
            full, pad, n = prompt + seq["tokens"], len(prompt) - 1, len(seq["tokens"])

            def tensor(values: list[float]) -> dict:
                return {"dtype": "float32", "shape": [len(values)], "values": values}

            inputs = {
                "target_tokens": {"dtype": "int64", "shape": [len(full) - 1], "values": full[1:]},
                "weights": tensor([0.0] * pad + [1.0] * n),
                "logprobs": tensor([0.0] * pad + seq["logprobs"]),
                "advantages": tensor([0.0] * pad + [reward - mean] * n),
            }
            data.append({"input": {"token_ids": full[:-1]}, "loss_inputs": inputs})
    return {"data": data, "loss_function": "importance_sampling", "loss_config": {}}


def worker(model: str, cycles: int, threads: int) -> dict[str, list[float]]:
    """Time `cycles` cycles (after one warm-up) of the engine importable here, then profile one
    more for the seconds of its matrix products."""
    import torch

    from whitney.local.engine import EngineRun
    from whitney.tokenizers import ByteTokenizer

    torch.set_num_threads(threads)
    if importlib.util.find_spec("whitney.local.engine.kernels") is not None:
        from whitney.local.engine import kernels  # this engine: its compiled kernels, waited for

        kernels.STATE.wait()
    tok = ByteTokenizer()
    prompts = [
        [tok.bos_id] + tok.encode(f"Question {i}: say the letter a, {'please ' * (i % 3)}")
        for i in range(8)
    ]
    run = EngineRun.create(base_model=model, lora_rank=8, seed=0)
    times: dict[str, list[float]] = {kind: [] for kind in KINDS + ("products",)}
    for cycle in range(cycles + 2):  # cycle 0 warms up, the last is profiled
        profiler = torch.profiler.profile() if cycle == cycles + 1 else None
        if profiler is not None:
            profiler.start()
        t0 = time.perf_counter()
        sampler = run.save_weights_for_sampler(f"cycle-{cycle}").result["sampler_id"]
        requests = [
            {"prompt": {"token_ids": p}, "num_samples": 8, "sampling_params": {"max_tokens": 32}}
            for p in prompts
        ]
        outs = run.sample(sampler, requests, [1000 * cycle + i for i in range(8)])
        t1 = time.perf_counter()
        run.forward(rl_payload(prompts, [o.result for o in outs], ord("a")), backward=True)
        t2 = time.perf_counter()
        run.optim_step({"type": "adamw", "learning_rate": 1e-3})
        t3 = time.perf_counter()
        if profiler is not None:
            profiler.stop()
            events = profiler.key_averages()
            products = sum(e.self_cpu_time_total for e in events if e.key in PRODUCTS) / 1e6
            times["products"].append(products)
        elif cycle:
            for kind, value in zip(KINDS, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
                times[kind].append(value)
    return times


def baseline_tree(ref: str, into: Path) -> Path:
    """The `whitney` package as of `ref`, extracted from git into `into`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "whitney"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def measure(path: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    """One worker process with `path` first on its import path."""
    env = os.environ | {"PYTHONPATH": str(path)}
    command = [sys.executable, __file__, "--worker", "--model", args.model]
    command += ["--cycles", str(args.cycles), "--threads", str(args.threads)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True, cwd=path)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(found["engine"]).is_relative_to(path):
        raise SystemExit(f"the worker imported {found['engine']}, not the engine under {path}")
    return found["times"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="local/tiny")
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="alternating pairs of workers")
    parser.add_argument("--baseline", default=BASELINE, metavar="REF", help="git commit")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import whitney

        times = worker(args.model, args.cycles, args.threads)
        print(json.dumps({"engine": whitney.__file__, "times": times}))
        return
    print(
        f"model {args.model}, torch threads {args.threads}, {args.rounds} rounds of "
        f"{args.cycles} cycles each (8 prompts x 8 samples x 32 tokens, forward_backward, "
        f"optim_step); baseline {args.baseline[:12]}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as scratch:
        old = baseline_tree(args.baseline, Path(scratch))
        found: dict[str, dict[str, list[float]]] = {"this tree": {}, "baseline": {}}
        for n in range(args.rounds):
            order = [("baseline", old), ("this tree", ROOT)]
            for name, path in order if n % 2 == 0 else order[::-1]:
                for kind, values in measure(path, args).items():
                    found[name].setdefault(kind, []).extend(values)
                print(f"  round {n + 1}/{args.rounds}: {name} done", flush=True)
    medians = {name: {k: statistics.median(v) for k, v in found[name].items()} for name in found}
    new, base = medians["this tree"], medians["baseline"]
    for kind in KINDS:
        ratio = f"{new[kind] / base[kind]:.2f}x" if base[kind] > 0 else "-"
        print(f"  {kind:17s} median {new[kind]:.3f} s vs baseline {base[kind]:.3f} s: {ratio}")
    floor = base["cycle"] - base["products"] + new["products"]
    print(
        f"  matrix products in a profiled cycle: {new['products']:.3f} s vs baseline "
        f"{base['products']:.3f} s; the baseline's cycle with this engine's products "
        f"{floor:.3f} s: {floor / base['cycle']:.2f}x (the least of exact products here)"
    )


if __name__ == "__main__":
    main()
