"""RL environments: where prompts come from and how a completion is rewarded.

A single-turn environment is any object with `prompts(cycle, count, seed)` and
`reward(prompt, completion)`; a prompt is text (one user turn) or a list of chat messages
(`whitney.renderers.Message`), which the flow renders with its renderer (its tokenizer, chat
template or format), and a completion is the text the renderer parses from the sample. A
multi-turn environment has `episode(task, seed)` instead: episodes of several turns
(`flows.core.environments.multiturn`). Built-ins by name, anything else by import path
`module:attr` (a class is instantiated without arguments).
Each cycle gets a fresh instance (a retried cycle replays from scratch), so an environment
keeps no state from one cycle to the next.

Evaluation samples an environment's held-out prompts (`held_out_prompts`): those of its
`eval_prompts()` when it has one (the built-ins do: prompts training never sees), else, by
default, `count` of its own prompts drawn with a seed of their own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from flows.core.imports import import_registered
from whitney.renderers import Prompt

if TYPE_CHECKING:
    from flows.core.environments.multiturn import MultiTurnEnvironment


@dataclass(frozen=True)
class Completion:
    """One sampled completion as text; `stopped` when it ended on a stop token, not on
    max_tokens."""

    text: str
    stopped: bool


@runtime_checkable
class Environment(Protocol):
    """Prompts for a cycle, and the reward of a completion of one of them."""

    def prompts(self, cycle: int, count: int, seed: int) -> list[Prompt]:
        """`count` prompts for `cycle` (text or messages); the same arguments must give the
        same prompts."""
        ...

    def reward(self, prompt: Prompt, completion: Completion) -> float:
        """The completion's reward (deterministic)."""
        ...


@runtime_checkable
class HeldOutPrompts(Protocol):
    """An environment's own held-out prompt set (optional; see `held_out_prompts`)."""

    def eval_prompts(self) -> list[Prompt]:
        """The prompts evaluation samples, none of which `prompts()` returns."""
        ...


EVAL_CYCLE = -1
"""The cycle the default held-out prompts are drawn for: one training never reaches."""


def held_out_prompts(environment: Environment, count: int, seed: int) -> list[Prompt]:
    """The environment's `eval_prompts()`, or by default `count` of its prompts for
    EVAL_CYCLE, drawn with `seed`."""
    if isinstance(environment, HeldOutPrompts):
        return list(environment.eval_prompts())
    return environment.prompts(EVAL_CYCLE, count, seed)


def seeded_prompts(choices: tuple[str, ...], count: int, seed: int) -> list[str]:
    """`count` prompts drawn from `choices` by a generator seeded with `seed`."""
    rng = random.Random(seed)
    return [rng.choice(choices) for _ in range(count)]


def character_share(text: str, allowed: frozenset[str]) -> float:
    """The share of `text`'s characters that are in `allowed` (0.0 for no text)."""
    return sum(character in allowed for character in text) / len(text) if text else 0.0


class CharacterShareEnvironment:
    """Prompts drawn from `PROMPTS`, held-out `EVAL_PROMPTS` (evaluation samples these,
    training never does), and a completion's reward: the share of its characters in
    `ALLOWED`."""

    PROMPTS: ClassVar[tuple[str, ...]] = ()
    EVAL_PROMPTS: ClassVar[tuple[str, ...]] = ()
    ALLOWED: ClassVar[frozenset[str]] = frozenset()

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        return seeded_prompts(self.PROMPTS, count, seed)

    def eval_prompts(self) -> list[str]:
        return list(self.EVAL_PROMPTS)

    def reward(self, prompt: str, completion: Completion) -> float:
        return character_share(completion.text, self.ALLOWED)


ENVIRONMENTS: dict[str, str] = {
    "arithmetic": "flows.core.environments.arithmetic:ArithmeticEnvironment",
    "digits": "flows.core.environments.digits:DigitsEnvironment",
    "lowercase": "flows.core.environments.lowercase:LowercaseEnvironment",
    "quiz": "flows.core.environments.quiz:QuizEnvironment",
}
"""Built-in environments by name."""


def load_environment(name: str) -> Environment | MultiTurnEnvironment:
    """The environment named `name` (built-in) or at import path `name`, single-turn or
    multi-turn (it has `episode()`); ValueError if none."""
    path, found = import_registered(ENVIRONMENTS, name, f"unknown environment {name!r}")
    environment = found() if isinstance(found, type) else found
    if callable(getattr(environment, "episode", None)):
        return environment  # type: ignore[return-value]
    if not isinstance(environment, Environment):
        raise ValueError(
            f"{path} is not an environment: it needs prompts() and reward() (single-turn) "
            "or episode() (multi-turn)"
        )
    return environment
