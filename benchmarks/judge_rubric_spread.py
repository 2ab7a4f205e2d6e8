"""How far apart does a small judge score replies? A frozen SmolLM2-135M-Instruct (the judge of
examples/judge-rubric.toml) rates seven replies to "What is 3 + 5?", from "8" to "I'm not sure
what you mean by that question", with its odds of "Yes" (mode logprobs: P(Yes) / (P(Yes) +
P(No))): under bare rubric questions in its chat template, then under the example's few-shot
question in plain text. Prints each rubric's reward of each reply and its spread (lowest to
highest), with progress; a judge whose spread is narrow gives a group's replies nearly the same
reward, so RL's advantages point nowhere (docs/judge.md, "The real model").

    python benchmarks/judge_rubric_spread.py [--config FILE] [--judge-model M]
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from judging import Frozen  # noqa: E402
from real_model_learning import machine, pulled  # noqa: E402

from flows.core.environments.rendering import load_renderer  # noqa: E402
from flows.rl.judge_config import JudgeSettings  # noqa: E402
from flows.rl.judge_rubric import Rubric  # noqa: E402
from whitney import hf_cache  # noqa: E402
from whitney.client import WhitneyClient  # noqa: E402
from whitney.local import EmbeddedWhitney  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is 3 + 5?"
REPLIES = (
    "8",
    "3 + 5 = 8",
    "The answer is 8.",
    "3 + 5 equals 8. Let me know if you have any other questions!",
    "The answer to this problem is 8, because we add the two numbers together.",
    "To solve this problem, we need to think about what addition",
    "I'm not sure what you mean by that question",
)
BARE_RUBRICS = (
    "Does the reply give the answer as one number, with no other words?",
    "Is the reply short?",
    "Is the reply a correct answer to the question?",
)
"""Bare rubric questions, asked with the built-in question template in the chat template."""


def spread(rewards: list[float]) -> str:
    return f"spread {min(rewards):.2f} to {max(rewards):.2f} ({max(rewards) - min(rewards):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "judge-rubric.toml")
    parser.add_argument("--judge-model", help="the example's judge model unless given")
    options = parser.parse_args()
    few_shot = tomllib.loads(options.config.read_text())["judge"]
    model = options.judge_model or few_shot["model"]
    real = pulled(model) is not None
    rubrics = [
        (f"bare, chat template: {rubric!r}", {"model": model, "rubric": rubric})
        for rubric in BARE_RUBRICS
    ]
    rubrics.append((f"few-shot, plain text ({options.config.name})", {**few_shot, "model": model}))
    print(f"machine: {machine()}", flush=True)
    print(f"judge {model} on {len(REPLIES)} replies to {PROMPT!r}", flush=True)
    with (
        EmbeddedWhitney(hf_cache=hf_cache.cache_dir() if real else None) as server,
        WhitneyClient(server.url, server.api_key) as client,
    ):
        session = client.open_session({"whitney-flows.role": "rubric-spread"})
        judge = Frozen.open(client, session.session_id, model)
        for label, fields in rubrics:
            settings = JudgeSettings(**(fields if real else {**fields, "renderer": "auto"}))
            renderer = load_renderer(model, settings.tokenizer, settings.renderer)
            rewards = judge.judged(Rubric(model, settings, renderer, 0), PROMPT, list(REPLIES))
            print(f"{label}: {spread(rewards)}", flush=True)
            for reply, reward in zip(REPLIES, rewards, strict=True):
                print(f"  {reward:.2f}  {reply!r}", flush=True)
        client.close_session(session.session_id)
    print(f"machine at the end: {machine()}")


if __name__ == "__main__":
    main()
