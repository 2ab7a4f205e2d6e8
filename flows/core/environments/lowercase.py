"""A graded style reward: write in lowercase letters and spaces.

The reward is the share of the completion's characters that are ASCII lowercase letters or
spaces (0.0 for an empty completion). The tiny byte model goes from about 0.1 to above 0.9
within about 10 cycles.
"""

from __future__ import annotations

from flows.core.environments import Completion, character_share, seeded_prompts

ALLOWED = frozenset("abcdefghijklmnopqrstuvwxyz ")
PROMPTS = ("Say: ", "Words: ", "Text: ", "Write: ")
EVAL_PROMPTS = ("Reply: ", "Speak: ", "Note: ", "Line: ")
"""Held-out prompts: evaluation samples these, training never does."""


class LowercaseEnvironment:
    """Prompts asking for text; rewards lowercase prose."""

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        return seeded_prompts(PROMPTS, count, seed)

    def eval_prompts(self) -> list[str]:
        return list(EVAL_PROMPTS)

    def reward(self, prompt: str, completion: Completion) -> float:
        return character_share(completion.text, ALLOWED)
