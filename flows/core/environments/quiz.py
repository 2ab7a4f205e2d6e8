"""A multi-turn quiz: three questions, each asking for a number or for a lowercase word.

Each episode is 3 turns. Each turn asks either for a number (`Number: `) or for a lowercase
word (`Word: `), in an order the episode's task draws, and the next observation says whether
the last answer was right before it asks the next question. So the right answer depends on
each turn's observation, not on the first prompt alone. An answer is right when it is one or
more ASCII digits (a number) or ASCII lowercase letters (a word) and nothing else. The reward
is the mean score of the three turns, a right answer scoring 1: the share of turns answered
right. A wrong answer scores half the share of its characters that fit the question, so a
random model gets a gradient to follow (as in `digits`).
"""

from __future__ import annotations

import random

from flows.core.environments import Completion, character_share
from flows.core.environments.multiturn import StepResult

TURNS = 3
QUESTIONS = {"number": "Number: ", "word": "Word: "}
ALLOWED = {"number": frozenset("0123456789"), "word": frozenset("abcdefghijklmnopqrstuvwxyz")}
VERDICTS = {True: "\nRight. ", False: "\nWrong. "}


def answer_score(kind: str, text: str) -> float:
    """1.0 for a right answer to a `kind` question, else half the share of fitting characters."""
    share = character_share(text, ALLOWED[kind])
    return 1.0 if share == 1.0 else 0.5 * share


class QuizEpisode:
    """Three questions in a seeded order; each step scores the answer and asks the next."""

    def __init__(self, task: int) -> None:
        rng = random.Random(task)
        self.kinds = [rng.choice(sorted(QUESTIONS)) for _ in range(TURNS)]
        self.turn = 0

    def initial_observation(self) -> str:
        return QUESTIONS[self.kinds[0]]

    def step(self, action: Completion) -> StepResult:
        score = answer_score(self.kinds[self.turn], action.text)
        self.turn += 1
        verdict = VERDICTS[score == 1.0]
        done = self.turn == TURNS
        question = "" if done else QUESTIONS[self.kinds[self.turn]]
        return StepResult(verdict.rstrip() if done else verdict + question, score / TURNS, done)


class QuizEnvironment:
    """The quiz: one `QuizEpisode` per task (the order of its questions)."""

    def episode(self, task: int, seed: int) -> QuizEpisode:
        return QuizEpisode(task)
