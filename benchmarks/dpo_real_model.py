"""Does DPO teach a real pretrained model a preference? The DPO flow on SmolLM2-135M-Instruct
(dequantised from the Q4_1 GGUF that `whitney-flows models pull smollm2-135m-instruct`
imports), on one embedded Whitney server, with pairs whose chosen answer to "What is a + b?"
is the short right sum and whose rejected one is a wrong sum or a rambling reply (the
arithmetic environment's prompts and answers: flows/core/environments/arithmetic.py). The
reference is the base model. Prints, on the held-out pairs, the preference accuracy (share of
pairs whose DPO margin is positive: 0 for the base model itself, whose margin is exactly 0)
and the share whose chosen answer the model itself finds more likely, before and after; the
minutes, the CPU and the load the machine was under. The share whose chosen answer the model
prefers is the measure of the base model; its preference accuracy is 0 by construction.

    python benchmarks/dpo_real_model.py [--pairs N] [--cycles N] [--pairs-per-cycle N]
        [--beta X] [--learning-rate X] [--eval-every N] [--base-model M]

`--base-model local/tiny` runs the same on the embedded byte model in seconds (a smoke check).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")  # busy CPU

from real_model_learning import cpu_model, data_flow_settings, followed, machine  # noqa: E402
from served import quiet_prefect  # noqa: E402

from flows.core.environments.arithmetic import answer, problem_text  # noqa: E402
from flows.dpo.config import DPOConfig  # noqa: E402
from flows.dpo.flow import dpo_flow  # noqa: E402
from flows.dpo.metrics import PreferenceEval  # noqa: E402

SMOLLM2 = "gguf/SmolLM2-135M-Instruct-Q4_1"
RAMBLES = (
    "Let me think about this carefully. Adding numbers can be tricky, so I would say {n}, "
    "although I am not completely sure about it.",
    "That is an interesting question! There are many ways to look at sums. Perhaps {n}?",
    "Well, first we should consider what addition means in general, and then the answer "
    "might be {n}, more or less.",
)


def preference_pairs(count: int, seed: int) -> list[dict[str, str]]:
    """`count` distinct two-digit sums: chosen the right sum, rejected a wrong one (half the
    pairs) or a rambling reply around a wrong one (the other half)."""
    rng = random.Random(seed)
    problems: set[tuple[int, str, int]] = set()
    while len(problems) < count:
        problems.add((rng.randint(10, 49), "+", rng.randint(10, 49)))
    pairs = []
    for index, problem in enumerate(sorted(problems)):
        right = answer(problem)
        wrong = right + rng.choice((-11, -10, -2, -1, 1, 2, 10, 11))
        rejected = str(wrong) if index % 2 else rng.choice(RAMBLES).format(n=wrong)
        pairs.append({"prompt": problem_text(problem), "chosen": str(right), "rejected": rejected})
    rng.shuffle(pairs)
    return pairs


def cycle_line(cycle: dict) -> str:
    """A DPO cycle's loss and margin (and evaluation) as one progress line."""
    first = (
        f"before training: {describe(PreferenceEval(**cycle['eval_before']))}\n"
        if cycle.get("eval_before")
        else ""
    )
    extra = f"; held-out {describe(PreferenceEval(**cycle['eval']))}" if cycle.get("eval") else ""
    return (
        f"{first}cycle {cycle['cycle']}: loss {cycle['loss']:.3f}, margin {cycle['margin']:.2f}, "
        f"{cycle['wall_seconds']:.0f} s{extra}"
    )


def describe(evaluation: PreferenceEval) -> str:
    return (
        f"preference accuracy {evaluation.accuracy:.3f}, chosen preferred "
        f"{evaluation.chosen_preferred:.3f}, loss {evaluation.loss:.3f} on {evaluation.pairs} pairs"
    )


def main() -> None:
    quiet_prefect()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=160, help="pairs in all (a fifth held out)")
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--pairs-per-cycle", type=int, default=8)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--eval-every", type=int, default=6)
    parser.add_argument("--base-model", default=SMOLLM2)
    options = parser.parse_args()
    pairs = preference_pairs(options.pairs, seed=0)
    print(f"machine: {machine()}", flush=True)
    with data_flow_settings(options.base_model, pairs) as (settings, metrics):
        config = DPOConfig(
            **settings,
            cycles=options.cycles,
            pairs_per_cycle=options.pairs_per_cycle,
            beta=options.beta,
            learning_rate=options.learning_rate,
            eval_every=options.eval_every,
        )
        print(
            f"{config.base_model}: {len(pairs)} pairs, {config.cycles} cycles of "
            f"{config.pairs_per_cycle} pairs, beta {config.beta:g}, lr {config.learning_rate:g}",
            flush=True,
        )
        result, seconds = followed(lambda: dpo_flow(config), metrics, cycle_line)
        minutes = seconds / 60
    print(f"machine at the end: {machine()}")
    before, after = result.eval_before, result.eval_after
    assert before is not None and after is not None, "eval_every > 0 evaluates before and after"
    print(f"  base model: {describe(before)}")
    print(f"  after DPO:  {describe(after)}")
    print(
        f"held-out chosen preferred {before.chosen_preferred:.3f} -> "
        f"{after.chosen_preferred:.3f}; preference accuracy {before.accuracy:.3f} -> "
        f"{after.accuracy:.3f} (from 0 by construction: every margin starts at exactly 0, the "
        f"reference being the policy before training), in {minutes:.1f} minutes "
        f"({len(result.cycles)} cycles and their evaluations), {config.base_model}, "
        f"on {cpu_model()}"
    )


if __name__ == "__main__":
    main()
