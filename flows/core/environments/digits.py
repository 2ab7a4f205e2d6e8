"""A verifiable format check: the completion must be a decimal number.

Reward 1.0 when the completion is one or more ASCII digits and nothing else; otherwise half
the share of its characters that are digits, so a random model gets a gradient to follow.
The tiny byte model goes from about 0.03 to above 0.9 within about 15 cycles.
"""

from __future__ import annotations

import random

from flows.core.environments import Completion

DIGITS = frozenset("0123456789")
PROMPTS = ("Number: ", "n=", "Digits: ", "Count: ", "x = ", "Answer: ")


class DigitsEnvironment:
    """Prompts asking for a number; rewards completions that are a number."""

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        rng = random.Random(seed)
        return [rng.choice(PROMPTS) for _ in range(count)]

    def reward(self, prompt: str, completion: Completion) -> float:
        text = completion.text
        if not text:
            return 0.0
        if all(character in DIGITS for character in text):
            return 1.0
        return 0.5 * sum(character in DIGITS for character in text) / len(text)
