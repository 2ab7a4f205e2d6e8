"""A graded style reward: write in lowercase letters and spaces.

The reward is the share of the completion's characters that are ASCII lowercase letters or
spaces (0.0 for an empty completion). The tiny byte model goes from about 0.1 to above 0.9
within about 10 cycles.
"""

from __future__ import annotations

import random

from flows.core.environments import Completion

ALLOWED = frozenset("abcdefghijklmnopqrstuvwxyz ")
PROMPTS = ("Say: ", "Words: ", "Text: ", "Write: ")


class LowercaseEnvironment:
    """Prompts asking for text; rewards lowercase prose."""

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        rng = random.Random(seed)
        return [rng.choice(PROMPTS) for _ in range(count)]

    def reward(self, prompt: str, completion: Completion) -> float:
        text = completion.text
        if not text:
            return 0.0
        return sum(character in ALLOWED for character in text) / len(text)
