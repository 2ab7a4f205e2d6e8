"""Learning-rate schedules against values computed by hand."""

from __future__ import annotations

import math

import pytest

from flows.sft.schedules import SCHEDULES, scheduled_rate


def rates(schedule: str, total: int, warmup: int, base: float = 1.0) -> list[float]:
    return [scheduled_rate(schedule, base, step, total, warmup) for step in range(total)]


def test_constant_with_warmup() -> None:
    assert rates("constant", 6, 4, base=0.2) == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2, 0.2])


def test_constant_without_warmup() -> None:
    assert rates("constant", 3, 0, base=3e-3) == [3e-3, 3e-3, 3e-3]


def test_linear_decays_from_the_end_of_warmup() -> None:
    # warmup 2: 1/2, 2/2; then p = (s - 2) / 8 for s = 2..9: 1 - p
    expected = [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]
    assert rates("linear", 10, 2) == pytest.approx(expected)


def test_cosine_without_warmup() -> None:
    # p = s / 6: (1 + cos(pi p)) / 2 = 1, (2 + sqrt 3) / 4, 3/4, 1/2, 1/4, (2 - sqrt 3) / 4
    root3 = math.sqrt(3)
    expected = [1.0, (2 + root3) / 4, 0.75, 0.5, 0.25, (2 - root3) / 4]
    assert rates("cosine", 6, 0) == pytest.approx(expected)


def test_cosine_with_warmup_and_a_base_rate() -> None:
    # warmup 1 at base; then p = (s - 1) / 4 for s = 1..4
    base = 2e-3
    expected = [base, base, base * (2 + math.sqrt(2)) / 4, base / 2, base * (2 - math.sqrt(2)) / 4]
    assert rates("cosine", 5, 1, base) == pytest.approx(expected)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_step_trains_at_a_positive_rate_at_most_the_base(schedule: str) -> None:
    values = rates(schedule, 50, 5, base=1e-3)
    assert all(0 < value <= 1e-3 for value in values)
    assert max(values) == pytest.approx(1e-3)


def test_warmup_longer_than_the_run_only_warms_up() -> None:
    assert rates("cosine", 3, 10) == pytest.approx([0.1, 0.2, 0.3])


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("cosine", 1.0, 5, 5, 0), "step must be within"),
        (("cosine", 1.0, -1, 5, 0), "step must be within"),
        (("cosine", 1.0, 0, 0, 0), "total must be at least 1"),
        (("cosine", 1.0, 0, 5, -1), "warmup must be >= 0"),
        (("exponential", 1.0, 0, 5, 1), "unknown schedule 'exponential'"),
    ],
)
def test_refuses_what_it_cannot_schedule(arguments: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scheduled_rate(*arguments)
