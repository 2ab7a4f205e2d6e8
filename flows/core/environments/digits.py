"""A verifiable format check: the completion must be a decimal number.

Reward 1.0 when the completion is one or more ASCII digits and nothing else; otherwise half
the share of its characters that are digits, so a random model gets a gradient to follow.
The tiny byte model goes from about 0.03 to above 0.9 within about 15 cycles.
"""

from __future__ import annotations

from flows.core.environments import CharacterShareEnvironment, Completion


class DigitsEnvironment(CharacterShareEnvironment):
    """Prompts asking for a number; rewards completions that are a number."""

    PROMPTS = ("Number: ", "n=", "Digits: ", "Count: ", "x = ", "Answer: ")
    EVAL_PROMPTS = (
        "Number? ",
        "Value: ",
        "Total: ",
        "Amount: ",
        "Size: ",
        "Age: ",
        "Year: ",
        "Sum: ",
    )
    ALLOWED = frozenset("0123456789")

    def reward(self, prompt: str, completion: Completion) -> float:
        share = super().reward(prompt, completion)
        return 1.0 if share == 1.0 else 0.5 * share
