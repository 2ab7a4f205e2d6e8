"""A single-turn environment of your own: prompts, and a reward computed on each sampled
completion's text (here the share of its characters that are capital letters).

Copy this file into your project and name its class in your RL config, `env = "shout:Shout"`
(module:attr, importable where whitney-flows runs), as examples/byo/shout.toml does; from the
repository root: `PYTHONPATH=examples/byo whitney-flows run rl --config examples/byo/shout.toml`.
"""

from __future__ import annotations

import random

from flows.core.environments import Completion

PROMPTS = ("Shout: ", "Say it loud: ", "HEY: ", "Louder: ", "Call out: ", "Yell: ")
EVAL_PROMPTS = ("Cheer: ", "Announce: ", "Roar: ")
CAPITALS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def capital_share(text: str) -> float:
    """The share of `text`'s characters that are ASCII capital letters (0.0 for no text)."""
    return sum(character in CAPITALS for character in text) / len(text) if text else 0.0


class Shout:
    """Prompts asking to shout; a completion's reward is its share of capital letters."""

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        """`count` prompts; the same arguments give the same prompts (a retried cycle replays)."""
        rng = random.Random(seed)
        return [rng.choice(PROMPTS) for _ in range(count)]

    def eval_prompts(self) -> list[str]:
        """Held-out prompts for evaluation (optional): training never samples them."""
        return list(EVAL_PROMPTS)

    def reward(self, prompt: str, completion: Completion) -> float:
        """The reward of one completion, deterministic: its text as the renderer parsed it."""
        return capital_share(completion.text)
