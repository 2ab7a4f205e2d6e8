"""One RL cycle on the engine in-process: 8 prompts x 8 samples x 32 tokens sampled, then
forward_backward (importance_sampling) on the 64 sequences and optim_step. Prints the figures.

    python benchmarks/engine_cycle.py [--model local/tiny] [--cycles 10] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from whitney.local.engine import EngineRun
from whitney.tokenizers import ByteTokenizer


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="local/tiny")
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = ByteTokenizer()
    prompts = [
        [tok.bos_id] + tok.encode(f"Question {i}: say the letter a, {'please ' * (i % 3)}")
        for i in range(8)
    ]
    run = EngineRun.create(base_model=args.model, lora_rank=8, seed=0)
    times: dict[str, list[float]] = {
        "sample": [],
        "forward_backward": [],
        "optim_step": [],
        "cycle": [],
    }
    for cycle in range(args.cycles + 1):  # cycle 0 warms up
        t0 = time.perf_counter()
        sampler = run.save_weights_for_sampler(f"cycle-{cycle}").result["sampler_id"]
        requests = [
            {"prompt": {"token_ids": p}, "num_samples": 8, "sampling_params": {"max_tokens": 32}}
            for p in prompts
        ]
        outs = run.sample(sampler, requests, [1000 * cycle + i for i in range(8)])
        t1 = time.perf_counter()
        payload = rl_payload(prompts, [o.result for o in outs], target=ord("a"))
        fb = run.forward(payload, backward=True)
        t2 = time.perf_counter()
        run.optim_step({"type": "adamw", "learning_rate": 1e-3})
        t3 = time.perf_counter()
        if cycle:
            for key, value in (
                ("sample", t1 - t0),
                ("forward_backward", t2 - t1),
                ("optim_step", t3 - t2),
                ("cycle", t3 - t0),
            ):
                times[key].append(value)
    sampled = sum(o.usage["sampled_tokens"] for o in outs)
    print(
        f"model {args.model}, torch threads {args.threads}, {args.cycles} cycles "
        f"(8 prompts x 8 samples x 32 tokens; last cycle sampled {sampled} tokens, "
        f"trained {fb.usage['trained_tokens']})"
    )
    for key, values in times.items():
        print(f"  {key:17s} median {statistics.median(values):.3f} s   min {min(values):.3f} s")


if __name__ == "__main__":
    main()
