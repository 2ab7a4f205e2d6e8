"""A graded style reward: write in lowercase letters and spaces.

The reward is the share of the completion's characters that are ASCII lowercase letters or
spaces (0.0 for an empty completion). The tiny byte model goes from about 0.1 to above 0.9
within about 10 cycles.
"""

from __future__ import annotations

from flows.core.environments import CharacterShareEnvironment


class LowercaseEnvironment(CharacterShareEnvironment):
    """Prompts asking for text; rewards lowercase prose."""

    PROMPTS = ("Say: ", "Words: ", "Text: ", "Write: ")
    EVAL_PROMPTS = ("Reply: ", "Speak: ", "Note: ", "Line: ")
    ALLOWED = frozenset("abcdefghijklmnopqrstuvwxyz ")
