"""The `arithmetic` environment: chat prompts "What is A + B?", a reward of 1 for a reply whose
last integer is the right result (cases worked out by hand), held-out problems training never
asks, and the settings it refuses."""

from __future__ import annotations

import re

import pytest

from flows.core.environments import Completion, held_out_prompts, load_environment
from flows.core.environments.arithmetic import ArithmeticEnvironment, last_integer


def reply(text: str) -> Completion:
    return Completion(text, stopped=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("68", 68),
        ("23 + 45 = 68.", 68),
        ("The answer is 7", 7),
        ("7 is the answer, not 8", 8),
        ("5 - 9 = -4", -4),
        ("1,234", 1234),
        ("12,34", 34),
        ("x-3", -3),
        ("no number here", None),
        ("", None),
    ],
)
def test_the_answer_is_the_last_integer(text: str, expected: int | None):
    assert last_integer(text) == expected


def test_the_reward_is_one_for_the_right_last_integer():
    environment = ArithmeticEnvironment(digits=2, operations="+-*")
    sum_prompt = [{"role": "user", "content": "What is 23 + 45?"}]
    assert environment.reward(sum_prompt, reply("23 + 45 = 68")) == 1.0
    assert environment.reward(sum_prompt, reply("68")) == 1.0
    assert environment.reward(sum_prompt, reply("23 + 45 = 69")) == 0.0
    assert environment.reward(sum_prompt, reply("68 + 1 = 69")) == 0.0  # the last one counts
    assert environment.reward(sum_prompt, reply("To add 23 and 45, we")) == 0.0
    assert environment.reward(sum_prompt, reply("sixty-eight")) == 0.0
    difference = [{"role": "user", "content": "What is 71 - 29?"}]
    assert environment.reward(difference, reply("42")) == 1.0
    product = [{"role": "user", "content": "What is 12 * 13?"}]
    assert environment.reward(product, reply("12 * 13 = 156")) == 1.0
    assert environment.reward(product, reply("25")) == 0.0


def test_prompts_are_chat_messages_with_operands_of_the_given_digits():
    environment = ArithmeticEnvironment(digits=3, operations="+-", instruction="Be brief.")
    prompts = environment.prompts(0, 50, seed=7)
    assert prompts == environment.prompts(0, 50, seed=7)  # deterministic
    assert prompts != environment.prompts(1, 50, seed=8)
    for prompt in prompts:
        assert len(prompt) == 1 and prompt[0]["role"] == "user"
        assert prompt[0]["content"].endswith("? Be brief.")
        left, symbol, right = environment.problem_of(prompt)
        assert 100 <= left <= 999 and 100 <= right <= 999 and symbol in "+-"
        assert symbol == "+" or left >= right  # no negative differences
    one_digit = ArithmeticEnvironment()
    problems = {one_digit.problem_of(p) for p in one_digit.prompts(0, 200, seed=1)}
    assert {left for left, _, _ in problems} == set(range(10))
    assert one_digit.prompts(0, 1, seed=1)[0][0]["content"].startswith("What is ")


def test_training_never_asks_a_held_out_problem():
    environment = ArithmeticEnvironment(digits=1)
    held_out = [environment.problem_of(p) for p in environment.eval_prompts()]
    assert len(held_out) == len(set(held_out)) == 25  # a quarter of the 100 one-digit sums
    asked = {
        environment.problem_of(p)
        for seed in range(20)
        for p in environment.prompts(seed, 64, seed=seed)
    }
    assert not asked & set(held_out)
    assert len(asked) == 59  # every other problem but the 16 held-out sums' twins is asked
    assert held_out_prompts(environment, 8, 0) == environment.eval_prompts()
    assert ArithmeticEnvironment(digits=1).eval_prompts() == environment.eval_prompts()
    assert len(ArithmeticEnvironment(digits=2).eval_prompts()) == 32


def test_training_never_asks_a_held_out_problem_swapped():
    """`b + a` is `a + b` to a learner: training never asks a held-out sum or product with its
    operands swapped; a difference (larger operand first) has no swapped twin to keep out."""
    environment = ArithmeticEnvironment(digits=1)
    held_out = {environment.problem_of(p) for p in environment.eval_prompts()}
    swapped = {(right, symbol, left) for left, symbol, right in held_out}
    assert len(swapped - held_out) == 16  # the built-in's twins that were once training sums
    every_sum = {(left, "+", right) for left in range(10) for right in range(10)}
    asked = {
        environment.problem_of(p)
        for seed in range(20)
        for p in environment.prompts(seed, 64, seed=seed)
    }
    assert asked == every_sum - held_out - swapped
    mixed = ArithmeticEnvironment(digits=1, operations="+-*", eval_count=60)
    kept_out = {mixed.problem_of(p) for p in mixed.eval_prompts()}
    kept_out |= {(right, symbol, left) for left, symbol, right in kept_out if symbol in "+*"}
    every_problem = {
        (left, symbol, right)
        for left in range(10)
        for right in range(10)
        for symbol in "+-*"
        if symbol != "-" or left >= right
    }
    asked = {mixed.problem_of(p) for seed in range(20) for p in mixed.prompts(0, 400, seed=seed)}
    assert asked == every_problem - kept_out


def test_the_built_in_is_one_digit_addition():
    environment = load_environment("arithmetic")
    assert isinstance(environment, ArithmeticEnvironment)
    assert (environment.digits, environment.operations) == (1, "+")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"digits": 0}, "digits must be 1 to 9"),
        ({"operations": "/"}, "operations must be some of '+-*'"),
        ({"operations": ""}, "operations must be some of '+-*'"),
        ({"digits": 1, "eval_count": 26}, "eval_count must be 1 to 25"),
    ],
)
def test_bad_settings_are_refused(options: dict, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        ArithmeticEnvironment(**options)


def test_a_prompt_of_another_environment_is_refused():
    with pytest.raises(ValueError, match="not an arithmetic prompt"):
        ArithmeticEnvironment().reward("Number: ", reply("3"))
