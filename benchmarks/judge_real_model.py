"""Does RL with a judge's reward move that reward on a real model? The RL flow of
examples/judge-rubric.toml (SmolLM2-135M-Instruct on one-digit sums, rewarded by a frozen
SmolLM2 judge's odds of "Yes" to a rubric question, docs/judge.md) on one embedded Whitney
server. Prints the judge's reward per cycle, its mean over the first and the last cycles, the
judge calls sent and answered from the cache, the minutes, the CPU and the load the machine
was under. The training reward is the reward optimised; then the held-out measure: the judge's
mean reward of replies to the environment's held-out prompts, which training never asked
(greedy, and `group_size` sampled each), from the base model and from the trained adapter.

    python benchmarks/judge_real_model.py [--config FILE] [--cycles N] [--group-size G]
        [--prompts-per-cycle P] [--max-tokens T] [--learning-rate X]
        [--base-model M --judge-model M]

`--base-model local/tiny --judge-model local/tiny --cycles 2` starts it in seconds with no
real model: a check that the script runs, not a learning result.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from judging import Frozen  # noqa: E402
from real_model_learning import cpu_model, followed, machine, pulled  # noqa: E402
from served import quiet_prefect  # noqa: E402

from flows.core.config import settings_with_overrides, validated  # noqa: E402
from flows.core.environments import held_out_prompts, load_environment  # noqa: E402
from flows.core.environments.rendering import config_renderer  # noqa: E402
from flows.rl.config import RLConfig  # noqa: E402
from flows.rl.flow import rl_flow  # noqa: E402
from flows.rl.plan import load_rubric  # noqa: E402
from whitney import hf_cache  # noqa: E402
from whitney.client import WhitneyClient  # noqa: E402
from whitney.local import EmbeddedWhitney  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = (
    "cycles",
    "group_size",
    "prompts_per_cycle",
    "max_tokens",
    "learning_rate",
    "base_model",
)
WINDOW = 3
"""Cycles averaged at each end of the reward curve."""


def cycle_line(cycle: dict) -> str:
    """An RL cycle's judged reward as one progress line."""
    return (
        f"cycle {cycle['cycle']}: judged reward {cycle['reward_mean']:.3f}, "
        f"{cycle['wall_seconds']:.0f} s"
    )


def with_judge_model(settings: dict, judge_model: str | None) -> dict:
    """The settings with `--judge-model` if given; a local/* model (policy or judge) renders
    raw (auto), the example's chat_template being SmolLM2's."""
    judge = dict(settings.get("judge", {}))
    if judge_model is not None:
        judge["model"] = judge_model
    if judge.get("model", "").startswith("local/"):
        judge["renderer"] = "auto"
    if settings.get("base_model", "").startswith("local/"):
        settings = {**settings, "renderer": "auto"}
    return {**settings, "judge": judge}


def held_out_judged(client: WhitneyClient, config: RLConfig, checkpoint: str) -> dict[str, str]:
    """The judge's mean reward of greedy and sampled replies to the environment's held-out
    prompts (never trained on), by the base model and by the trained adapter (`checkpoint`)."""
    rubric = load_rubric(config, multi_turn=False)
    assert rubric is not None, "the config names a judge"
    renderer = config_renderer(config)
    prompts = held_out_prompts(load_environment(config.env), 32, config.seed)
    session = client.open_session({"whitney-flows.role": "held-out-judged"})
    judge = Frozen.open(client, session.session_id, rubric.model)
    measured = {}
    for label, weights in (("base model", None), ("trained", checkpoint)):
        policy = Frozen.open(
            client, session.session_id, config.base_model, weights, config.lora_rank
        )
        greedy, sampled = [], []
        for index, prompt in enumerate(prompts):
            best = policy.replies(renderer, prompt, 1, config.max_tokens, top_k=1)
            drawn = policy.replies(
                renderer,
                prompt,
                config.group_size,
                config.max_tokens,
                temperature=config.temperature,
                seed=config.seed + index,
            )
            rewards = judge.judged(rubric, prompt, best + drawn)
            greedy.append(rewards[0])
            sampled.extend(rewards[1:])
        measured[label] = (
            f"greedy {statistics.fmean(greedy):.3f}, sampled {statistics.fmean(sampled):.3f}"
        )
        print(f"held-out judged reward, {label}: {measured[label]}", flush=True)
    client.close_session(session.session_id)
    return measured


def main() -> None:
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")  # busy CPU
    quiet_prefect()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "judge-rubric.toml")
    parser.add_argument("--cycles", type=int)
    parser.add_argument("--group-size", type=int)
    parser.add_argument("--prompts-per-cycle", type=int)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--base-model")
    parser.add_argument("--judge-model")
    options = parser.parse_args()
    settings = settings_with_overrides(
        options.config, {name: getattr(options, name) for name in OVERRIDES}
    )
    config = validated(RLConfig, with_judge_model(settings, options.judge_model))
    for model in {config.base_model, config.judge.model}:
        if model:
            pulled(model)
    print(f"machine: {machine()}", flush=True)
    print(
        f"config: {options.config.name}, {config.base_model} judged by {config.judge.model} "
        f"({config.judge.mode}: {config.judge.rubric!r}), {config.cycles} cycles of "
        f"{config.prompts_per_cycle} prompts x {config.group_size} samples x "
        f"{config.max_tokens} tokens, lr {config.learning_rate:g}",
        flush=True,
    )
    with (
        EmbeddedWhitney(hf_cache=hf_cache.cache_dir()) as server,
        tempfile.TemporaryDirectory(prefix="whitney-bench-") as scratch,
    ):
        os.environ["WHITNEY_API_KEY"] = server.api_key
        judge = config.judge.model_copy(update={"cache_dir": str(Path(scratch) / "judge")})
        metrics = Path(scratch) / "metrics.jsonl"
        config = config.model_copy(
            update={"api_url": server.url, "judge": judge, "metrics_path": str(metrics)}
        )
        result, seconds = followed(lambda: rl_flow(config), metrics, cycle_line)
        minutes = seconds / 60
        (cache,) = (Path(scratch) / "judge").iterdir()
        asked = len(cache.read_text().splitlines())
        prompts = len(held_out_prompts(load_environment(config.env), 32, config.seed))
        print(f"judging replies to the {prompts} held-out prompts (never trained on)", flush=True)
        with WhitneyClient(server.url, server.api_key) as client:
            held_out = held_out_judged(client, config, result.checkpoint)
    rewards = [cycle.reward_mean for cycle in result.cycles]
    window = max(1, min(WINDOW, len(rewards) // 2))
    first, last = statistics.fmean(rewards[:window]), statistics.fmean(rewards[-window:])
    completions = len(rewards) * config.prompts_per_cycle * config.group_size
    print(f"machine at the end: {machine()}")
    print("judged reward per cycle: " + " ".join(f"{reward:.3f}" for reward in rewards))
    print(f"judge questions asked: {asked} for {completions} completions (the rest cached)")
    print(
        f"judged reward, first {window} cycles {first:.3f} -> last {window} {last:.3f} "
        f"({last - first:+.3f}) in {minutes:.1f} minutes, {config.base_model} judged by "
        f"{config.judge.model}, on {cpu_model()}"
    )
    print(
        f"held-out judged reward on {prompts} prompts never trained on: base model "
        f"{held_out['base model']} -> trained {held_out['trained']}"
    )


if __name__ == "__main__":
    main()
