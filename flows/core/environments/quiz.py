"""A multi-turn quiz: three questions, each asking for a number or for a lowercase word.

Each episode is 3 turns. It opens with a legend, `Number #12 Word:ab`, then each turn asks
either for a number (`Number #`) or for a lowercase word (`Word:`), in an order the episode's
task draws; the next observation says whether the last answer was right (`Right.` or
`Wrong.`) before it asks the next question. An answer is one token (`max_action_tokens`): it
is right when it is a digit (a number) or a lowercase ASCII letter (a word). The reward is the
share of turns answered right. Rendered raw (`local/*`), an episode reads

    BOS "Number #12 Word:ab\nWord:" a EOS "\nRight. Number #" x EOS "\nWrong. Number #" 7

where each answer is one sampled token and the EOS after it closes the cut action.

Why this shape (the tiny byte model learns it on 2 cores; docs/multi-turn.md):

- The question's kind is the last character before the answer (`#` or `:`), and the legend
  puts both kinds in every transcript from the first turn on. With `Number: ` and `Word: `
  prompts the model answered the first turn right (its context holds only that question) but
  answered the later turns from the earlier ones' content: it did not find the latest question
  in a longer transcript within 30 cycles.
- Answers are one token and the reward is 0 or 1 a turn. With 12-token answers a random model
  almost never answers right, so it learned from partial credit for the characters that fit,
  and the more common lowercase letters took over every answer before the model learned to read
  the question.
"""

from __future__ import annotations

import random

from flows.core.environments import Completion, character_share
from flows.core.environments.multiturn import StepResult

TURNS = 3
LEGEND = "Number #12 Word:ab\n"
QUESTIONS = {"number": "Number #", "word": "Word:"}
ALLOWED = {"number": frozenset("0123456789"), "word": frozenset("abcdefghijklmnopqrstuvwxyz")}
VERDICTS = {True: "\nRight.", False: "\nWrong."}


def right_answer(kind: str, text: str) -> bool:
    """Whether `text` answers a `kind` question: one or more characters, all of that kind."""
    return character_share(text, ALLOWED[kind]) == 1.0


class QuizEpisode:
    """Three questions in a seeded order; each step judges the answer and asks the next."""

    def __init__(self, task: int) -> None:
        rng = random.Random(task)
        self.kinds = [rng.choice(sorted(QUESTIONS)) for _ in range(TURNS)]
        self.turn = 0

    def initial_observation(self) -> str:
        return LEGEND + QUESTIONS[self.kinds[0]]

    def step(self, action: Completion) -> StepResult:
        right = right_answer(self.kinds[self.turn], action.text)
        self.turn += 1
        done = self.turn == TURNS
        question = "" if done else " " + QUESTIONS[self.kinds[self.turn]]
        return StepResult(VERDICTS[right] + question, float(right) / TURNS, done)


class QuizEnvironment:
    """The quiz: one `QuizEpisode` per task (the order of its questions)."""

    max_action_tokens = 1

    def episode(self, task: int, seed: int) -> QuizEpisode:
        return QuizEpisode(task)
