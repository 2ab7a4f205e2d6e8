"""Does SFT on chat conversations lower a real model's held-out loss? The SFT flow on
SmolLM2-135M-Instruct (dequantised from the Q4_1 GGUF that `whitney-flows models pull
smollm2-135m-instruct` imports), on one embedded Whitney server, with the arithmetic
environment's training sums as `{"messages": [...]}` lines ("What is 3 + 4?", "3 + 4 = 7", then
"What is 4 + 3?", "4 + 3 = 7": both orders in one conversation, so none is trained on while its
twin is held out), a fifth of the conversations held out by the flow (`eval_fraction`). Prints
each step's training loss as it goes (one step a cycle), then the eval loss per token on the
held-out conversations before the first step and after the last, the seconds, the CPU and the
load the machine was under.

    python benchmarks/sft_real_model.py [--steps N] [--batch-size N] [--learning-rate X]
        [--base-model M]

`--base-model local/tiny` runs the same on the embedded byte model in minutes (a smoke check).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")  # busy CPU

from real_model_learning import cpu_model, data_flow_settings, followed, machine  # noqa: E402
from served import quiet_prefect  # noqa: E402

from flows.core.environments.arithmetic import (  # noqa: E402
    ArithmeticEnvironment,
    problem_text,
)
from flows.sft.config import SFTConfig  # noqa: E402
from flows.sft.flow import sft_flow  # noqa: E402

SMOLLM2 = "gguf/SmolLM2-135M-Instruct-Q4_1"


def conversations() -> list[dict]:
    """The built-in arithmetic environment's training sums (every one-digit sum neither held
    out nor a held-out sum's twin), a conversation per pair of operands: the user asks `a + b`,
    the assistant answers `a + b = c`, then the same with the operands swapped (one turn when
    they are equal), so the flow's held-out split never has a sum's twin in training."""
    environment = ArithmeticEnvironment()
    pairs = [
        (left, right)
        for left in range(10)
        for right in range(left, 10)
        if (left, "+", right) not in environment.held_out_set
    ]
    return [
        {
            "messages": [
                message
                for a, b in dict.fromkeys([(left, right), (right, left)])
                for message in (
                    {"role": "user", "content": problem_text((a, "+", b))},
                    {"role": "assistant", "content": f"{a} + {b} = {a + b}"},
                )
            ]
        }
        for left, right in pairs
    ]


def cycle_line(cycle: dict) -> str:
    """An SFT cycle's losses as one progress line."""
    evals = "".join(f", held-out loss {e['loss']:.3f} at step {e['step']}" for e in cycle["evals"])
    return (
        f"cycle {cycle['cycle']}: train loss {cycle['train_loss']:.3f}{evals}, "
        f"{cycle['wall_seconds']:.0f} s"
    )


def main() -> None:
    quiet_prefect()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--base-model", default=SMOLLM2)
    options = parser.parse_args()
    examples = conversations()
    print(f"machine: {machine()}", flush=True)
    with data_flow_settings(options.base_model, examples) as (settings, metrics):
        config = SFTConfig(
            **settings,
            steps=options.steps,
            steps_per_cycle=1,
            batch_size=options.batch_size,
            learning_rate=options.learning_rate,
            schedule="constant",
            warmup_steps=0,
            eval_fraction=0.2,
            eval_every=options.steps,
        )
        print(
            f"{config.base_model}: {len(examples)} conversations of both orders of a sum "
            f"({sum(len(e['messages']) for e in examples) // 2} sums; a fifth held out), "
            f"{config.steps} steps of {config.batch_size} at a constant lr "
            f"{config.learning_rate:g}",
            flush=True,
        )
        result, seconds = followed(lambda: sft_flow(config), metrics, cycle_line)
    print(f"machine at the end: {machine()}")
    before, after = result.eval_losses[0], result.eval_losses[-1]
    print(
        f"held-out loss per token {before:.3f} -> {after:.3f} in {result.steps} steps, "
        f"{seconds:.0f} s ({len(result.cycles)} cycles and their evaluations), "
        f"{config.base_model}, on {cpu_model()}"
    )


if __name__ == "__main__":
    main()
