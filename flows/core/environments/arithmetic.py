"""Arithmetic: a chat prompt asks for a sum (or a difference, or a product); the reward is 1 when
the reply's answer is right.

A prompt is one user message, `What is 23 + 45?` (plus `instruction`, if set, after a space).
The reply's answer is its last integer: the last run of digits, with a `-` right before it
taken as a minus sign and commas between digit groups ignored (`1,234` is 1234), so "23 + 45
= 68" answers 68 and "68." answers 68. The reward is 1.0 when that integer is the right
result, else 0.0 (also for a reply with no integer).

Operands have `digits` digits (1: 0 to 9; 2: 10 to 99; ...); `operations` are drawn from
`+`, `-` (the larger operand first: no negative results) and `*`. The held-out problems are
`eval_count` problems (default 32, at most a quarter of them all) drawn once from a seed of
their own; training never asks them nor their swapped twins (`5 + 3` for `3 + 5`, `5 * 3` for
`3 * 5`): a drawn problem that is held out is drawn again. The built-in `arithmetic` is
one-digit addition (25 held-out sums, whose 16 twins are held out too: 59 for training); another
setting is an instance at an import path, e.g. `env = "mymodule:SUMS"` with
`SUMS = ArithmeticEnvironment(digits=3, operations="+-*")`.
"""

from __future__ import annotations

import operator
import random
import re
from collections.abc import Callable

from flows.core.environments import Completion
from whitney.renderers import Message, Prompt

OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}
COMMUTATIVE = "+*"
"""The operations whose swapped problem (b op a) has the same answer: its twin."""
INTEGER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?!\d)|-?\d+")
EVAL_COUNT = 32
"""Held-out problems by default (at most a quarter of all the problems)."""
EVAL_SEED = 20261203
"""The seed of the held-out problems (whatever the run's seed: the same eval set for all)."""

Problem = tuple[int, str, int]


def last_integer(text: str) -> int | None:
    """The reply's answer: its last integer (see the module docstring), None if it has none."""
    found = INTEGER.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def problem_text(problem: Problem) -> str:
    left, symbol, right = problem
    return f"What is {left} {symbol} {right}?"


def twin(problem: Problem) -> Problem:
    """The problem with its operands swapped (itself for a difference, never asked swapped)."""
    left, symbol, right = problem
    return (right, symbol, left) if symbol in COMMUTATIVE else problem


def answer(problem: Problem) -> int:
    left, symbol, right = problem
    return OPERATIONS[symbol](left, right)


class ArithmeticEnvironment:
    """Arithmetic problems as chat prompts, rewarded by their reply's last integer."""

    def __init__(
        self,
        digits: int = 1,
        operations: str = "+",
        eval_count: int | None = None,
        instruction: str = "",
    ) -> None:
        if digits < 1 or digits > 9:
            raise ValueError(f"digits must be 1 to 9, got {digits}")
        unknown = sorted(set(operations) - set(OPERATIONS))
        if not operations or unknown:
            raise ValueError(f"operations must be some of '+-*', got {operations!r}")
        self.digits = digits
        self.operations = "".join(dict.fromkeys(operations))
        self.instruction = instruction
        self.low = 0 if digits == 1 else 10 ** (digits - 1)
        self.high = 10**digits - 1
        space = (self.high - self.low + 1) ** 2 * len(self.operations)
        eval_count = min(EVAL_COUNT, space // 4) if eval_count is None else eval_count
        if not 0 < eval_count <= space // 4:
            raise ValueError(f"eval_count must be 1 to {space // 4} (a quarter of the problems)")
        self.held_out = self.draw(random.Random(EVAL_SEED), eval_count, frozenset(), True)
        self.held_out_set = frozenset(self.held_out) | {twin(p) for p in self.held_out}
        """What training never asks: the held-out problems and their twins."""

    def draw(
        self, rng: random.Random, count: int, excluded: frozenset[Problem], distinct: bool
    ) -> list[Problem]:
        """`count` problems none of which is in `excluded`, all different if `distinct`."""
        problems: list[Problem] = []
        while len(problems) < count:
            left, right = rng.randint(self.low, self.high), rng.randint(self.low, self.high)
            symbol = rng.choice(self.operations)
            if symbol == "-" and left < right:
                left, right = right, left
            problem = (left, symbol, right)
            if problem not in excluded and not (distinct and problem in problems):
                problems.append(problem)
        return problems

    def prompt(self, problem: Problem) -> list[Message]:
        text = problem_text(problem)
        content = f"{text} {self.instruction}" if self.instruction else text
        return [{"role": "user", "content": content}]

    def prompts(self, cycle: int, count: int, seed: int) -> list[Prompt]:
        rng = random.Random(seed)
        return [self.prompt(p) for p in self.draw(rng, count, self.held_out_set, False)]

    def eval_prompts(self) -> list[Prompt]:
        return [self.prompt(problem) for problem in self.held_out]

    def reward(self, prompt: Prompt, completion: Completion) -> float:
        return float(last_integer(completion.text) == answer(self.problem_of(prompt)))

    def problem_of(self, prompt: Prompt) -> Problem:
        """The problem a prompt of this environment asks."""
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        found = re.search(r"What is (\d+) ([-+*]) (\d+)\?", text)
        if found is None:
            raise ValueError(f"not an arithmetic prompt: {text!r}")
        return int(found[1]), found[2], int(found[3])
