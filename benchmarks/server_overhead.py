"""What the Whitney HTTP layer costs: the same work through `WhitneyClient` -> `EmbeddedWhitney`
(loopback HTTP, journal, ordered executor) and through the engine called in-process.

Two workloads, interleaved (HTTP, in-process, HTTP, ...) so both see the same machine:

- one RL cycle: save_weights_for_sampler, sample 8 prompts x 8 samples x 32 tokens (over HTTP
  the 8 sample operations fan out at once with reserved seq ids, as the flows do),
  forward_backward on the 64 completions, optim_step;
- one forward_backward of 16 sequences x 128 tokens.

Prints the medians, the HTTP / in-process ratios (aim: <= 1.25) and the cycle time.

    python benchmarks/server_overhead.py [--repeats 7] [--base-model local/tiny]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from whitney.client import WhitneyClient  # noqa: E402
from whitney.datums import rl_datum, sft_datum  # noqa: E402
from whitney.local import EmbeddedWhitney  # noqa: E402
from whitney.local.execution import default_seed  # noqa: E402

PROMPTS, SAMPLES, SAMPLE_TOKENS = 8, 8, 32
FB_SEQUENCES, FB_TOKENS = 16, 128
OPTIMIZER = {"type": "adamw", "learning_rate": 1e-4}


def prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(32, 127) for _ in range(12)] for _ in range(PROMPTS)]


def sample_requests() -> list[dict]:
    return [
        {
            "prompt": {"token_ids": prompt},
            "num_samples": SAMPLES,
            "sampling_params": {"max_tokens": SAMPLE_TOKENS, "temperature": 1.0},
        }
        for prompt in prompts()
    ]


def rl_payload(requests: list[dict], results: list[dict]) -> dict:
    data = []
    for request, result in zip(requests, results, strict=True):
        prompt = request["prompt"]["token_ids"]
        for index, seq in enumerate(result["sequences"]):
            if len(seq["tokens"]) == 0:
                continue
            advantage = (index - (SAMPLES - 1) / 2) / SAMPLES
            data.append(rl_datum(prompt, seq["tokens"], seq["logprobs"], advantage))
    return {"data": data, "loss_function": "importance_sampling", "loss_config": {}}


def long_payload() -> dict:
    rng = random.Random(1)
    data = []
    for _ in range(FB_SEQUENCES):
        tokens = [rng.randrange(0, 256) for _ in range(FB_TOKENS + 1)]
        data.append(sft_datum(tokens[:8], tokens[8:]))
    return {"data": data, "loss_function": "cross_entropy", "loss_config": {}}


class Http:
    """The workloads through the SDK client and the embedded server."""

    def __init__(self, server: EmbeddedWhitney, base_model: str) -> None:
        self.client = WhitneyClient(server.url, server.api_key)
        session = self.client.open_session({"benchmark": "server_overhead"})
        self.run_id = self.client.create_run(
            session.session_id, "local", base_model, lora_rank=8, seed=0
        ).run_id
        self.pool = ThreadPoolExecutor(max_workers=PROMPTS)
        self.cycles = 0

    def rl_cycle(self) -> None:
        self.cycles += 1
        name = f"bench-{self.cycles}"
        requests = sample_requests()
        self.client.run_operation(self.run_id, "save_weights_for_sampler", {"name": name})
        seqs = self.client.reserve_seq_ids(self.run_id, len(requests))
        futures = [
            self.pool.submit(
                self.client.sampler_operation, self.run_id, name, "sample", request, seq_id=seq
            )
            for seq, request in zip(seqs, requests, strict=True)
        ]
        results = [future.result() for future in futures]
        self.client.run_operation(self.run_id, "forward_backward", rl_payload(requests, results))
        self.client.run_operation(self.run_id, "optim_step", {"optimizer": OPTIMIZER})

    def long_forward_backward(self) -> None:
        self.client.run_operation(self.run_id, "forward_backward", long_payload())
        self.client.run_operation(self.run_id, "optim_step", {"optimizer": OPTIMIZER})

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()


class InProcess:
    """The same workloads on an EngineRun called directly."""

    def __init__(self, base_model: str) -> None:
        from whitney.local.engine import EngineRun

        self.run = EngineRun.create(base_model=base_model, lora_rank=8, seed=0)
        self.cycles = 0
        self.seq = 0

    def rl_cycle(self) -> None:
        self.cycles += 1
        name = f"bench-{self.cycles}"
        requests = sample_requests()
        self.run.save_weights_for_sampler(name)
        seeds = [default_seed(0, self.seq + i) for i in range(len(requests))]
        self.seq += len(requests)
        results = [out.result for out in self.run.sample(name, requests, seeds)]
        self.run.forward(rl_payload(requests, results), backward=True)
        self.run.optim_step(OPTIMIZER)

    def long_forward_backward(self) -> None:
        self.run.forward(long_payload(), backward=True)
        self.run.optim_step(OPTIMIZER)

    def close(self) -> None:
        pass


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process: client, server and engine threads)."""
    started, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - started, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--base-model", default="local/tiny")
    args = parser.parse_args(argv)

    workloads = {
        "rl_cycle": "RL cycle (8x8x32 sample, fb, optim)",
        "long_forward_backward": "forward_backward 16x128 + optim",
    }
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with EmbeddedWhitney() as server:
        sides = {"http": Http(server, args.base_model), "in-process": InProcess(args.base_model)}
        try:
            for side in sides.values():  # warm up: first calls build caches
                side.rl_cycle()
                side.long_forward_backward()
            for _ in range(args.repeats):
                for workload in workloads:
                    for name, side in sides.items():
                        times.setdefault((workload, name), []).append(
                            timed(getattr(side, workload))
                        )
        finally:
            for side in sides.values():
                side.close()

    def median(workload: str, side: str, index: int) -> float:
        return statistics.median(sample[index] for sample in times[(workload, side)])

    print(f"base model {args.base_model}, {args.repeats} repeats, medians")
    print(
        f"{'workload':38} {'in-process':>10} {'http':>10} {'ratio':>6}"
        f" {'cpu in-proc':>11} {'cpu http':>10} {'ratio':>6}"
    )
    ratios = {}
    for workload, label in workloads.items():
        local, remote = median(workload, "in-process", 0), median(workload, "http", 0)
        local_cpu, remote_cpu = median(workload, "in-process", 1), median(workload, "http", 1)
        ratios[workload] = remote / local
        print(
            f"{label:38} {local * 1000:8.1f}ms {remote * 1000:8.1f}ms {remote / local:6.3f}"
            f" {local_cpu * 1000:9.1f}ms {remote_cpu * 1000:8.1f}ms {remote_cpu / local_cpu:6.3f}"
        )
    cycle = median("rl_cycle", "http", 0)
    print(f"RL cycle time over HTTP: {cycle:.3f} s")
    worst = max(ratios.values())
    print(f"worst HTTP / in-process ratio: {worst:.3f} ({'ok' if worst <= 1.25 else 'over'} 1.25)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
