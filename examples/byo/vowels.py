"""A multi-turn environment of your own: three turns, each asking for a word; the environment
answers whether the last word held a vowel, and each word with a vowel earns a third.

Copy this file into your project and name its class in your RL config, `env = "vowels:Vowels"`
with `rollout.max_turns = 3`, as examples/byo/vowels.toml does; from the repository root:
`PYTHONPATH=examples/byo whitney-flows run rl --config examples/byo/vowels.toml`.
"""

from __future__ import annotations

from flows.core.environments import Completion
from flows.core.environments.multiturn import StepResult

TURNS = 3
ASK = "Say a word: "
VOWELS = frozenset("aeiouAEIOU")


def has_vowel(text: str) -> bool:
    """Whether `text` holds a vowel."""
    return any(character in VOWELS for character in text)


class VowelEpisode:
    """One game of TURNS turns; `step` judges a word and asks for the next."""

    def __init__(self) -> None:
        self.turn = 0

    def initial_observation(self) -> str:
        """The first turn's prompt."""
        return ASK

    def step(self, action: Completion) -> StepResult:
        """The answer to one word (deterministic: a retried cycle replays its turns)."""
        right = has_vowel(action.text)
        self.turn += 1
        verdict = " Vowel!" if right else " No vowel."
        return StepResult(f"{verdict} {ASK}", reward=right / TURNS, done=self.turn == TURNS)


class Vowels:
    """Episodes of the vowel game; every task plays the same game."""

    max_action_tokens = 4

    def episode(self, task: int, seed: int) -> VowelEpisode:
        """A fresh episode of `task`."""
        return VowelEpisode()
