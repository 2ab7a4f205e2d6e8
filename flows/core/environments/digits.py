"""A verifiable format check: the completion must be a decimal number.

Reward 1.0 when the completion is one or more ASCII digits and nothing else; otherwise half
the share of its characters that are digits, so a random model gets a gradient to follow.
The tiny byte model goes from about 0.03 to above 0.9 within about 15 cycles.
"""

from __future__ import annotations

from flows.core.environments import Completion, character_share, seeded_prompts

DIGITS = frozenset("0123456789")
PROMPTS = ("Number: ", "n=", "Digits: ", "Count: ", "x = ", "Answer: ")
EVAL_PROMPTS = ("Number? ", "Value: ", "Total: ", "Amount: ", "Size: ", "Age: ", "Year: ", "Sum: ")
"""Held-out prompts: evaluation samples these, training never does."""


class DigitsEnvironment:
    """Prompts asking for a number; rewards completions that are a number."""

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        return seeded_prompts(PROMPTS, count, seed)

    def eval_prompts(self) -> list[str]:
        return list(EVAL_PROMPTS)

    def reward(self, prompt: str, completion: Completion) -> float:
        share = character_share(completion.text, DIGITS)
        return 1.0 if share == 1.0 else 0.5 * share
