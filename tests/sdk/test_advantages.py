"""The page's advantage helpers, against values worked out by hand."""

import pytest

from whitney.advantages import (
    all_zero,
    group_mean_advantages,
    kl_adjust_advantages,
    leave_one_out_baseline,
    length_normalize,
)


def test_group_mean_advantages_centres_on_the_mean():
    # mean 0.5
    assert group_mean_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    # mean 5
    assert group_mean_advantages([2.0, 4.0, 9.0]) == [-3.0, -1.0, 4.0]


def test_group_mean_advantages_normalize_std():
    # centred 0.5/-0.5, variance 0.25, std 0.5
    assert group_mean_advantages([1.0, 0.0, 0.0, 1.0], normalize_std=True) == [
        1.0,
        -1.0,
        -1.0,
        1.0,
    ]
    # centred -3, -1, 4; variance (9 + 1 + 16) / 3 = 8.6667; std 2.94392
    assert group_mean_advantages([2.0, 4.0, 9.0], normalize_std=True) == pytest.approx(
        [-1.019049, -0.339683, 1.358732], rel=1e-5
    )


def test_group_mean_advantages_uniform_group_is_all_zero_even_with_std():
    advantages = group_mean_advantages([1.0, 1.0, 1.0], normalize_std=True)
    assert advantages == [0.0, 0.0, 0.0]
    assert all_zero(advantages)


@pytest.mark.parametrize("rewards", [[], [1.0]])
@pytest.mark.parametrize(
    ("helper", "message"),
    [
        (
            group_mean_advantages,
            "group_mean_advantages needs at least two rewards to form a group",
        ),
        (
            leave_one_out_baseline,
            "leave_one_out_baseline needs at least two rewards to form a group",
        ),
    ],
    ids=["group_mean_advantages", "leave_one_out_baseline"],
)
def test_a_group_needs_two_rewards(helper, message, rewards):
    with pytest.raises(ValueError) as caught:
        helper(rewards)
    assert str(caught.value) == message


def test_all_zero():
    assert all_zero([0.0, -0.0, 0]) is True
    assert all_zero([0.0, 1e-9]) is False
    assert all_zero([-2.0]) is False
    assert all_zero([]) is True


def test_leave_one_out_baseline():
    # 1 - (2 - 1) / 3 = 2/3 ; 0 - 2 / 3 = -2/3
    assert leave_one_out_baseline([1.0, 0.0, 0.0, 1.0]) == pytest.approx(
        [0.666667, -0.666667, -0.666667, 0.666667], rel=1e-5
    )
    assert leave_one_out_baseline([3.0, 1.0]) == [2.0, -2.0]
    # 6 - (1 + 2) / 2 = 4.5 ; 1 - 8 / 2 = -3 ; 2 - 7 / 2 = -1.5
    assert leave_one_out_baseline([6.0, 1.0, 2.0]) == [4.5, -3.0, -1.5]


def test_length_normalize():
    assert length_normalize(3.0, 4) == 0.75
    assert length_normalize(-1.0, 2) == -0.5


@pytest.mark.parametrize("length", [0, -3])
def test_length_normalize_needs_a_positive_length(length):
    with pytest.raises(ValueError) as caught:
        length_normalize(1.0, length)
    assert str(caught.value) == "completion_length must be positive"


def test_kl_adjust_advantages():
    # 1 - 0.5 * (-0.5 + 0.7) = 0.9 ; 1 - 0.5 * 0 = 1 ; 0 - 0.5 * (-2 + 1.5) = 0.25
    adjusted = kl_adjust_advantages(
        [1.0, 1.0, 0.0], [-0.5, -1.0, -2.0], [-0.7, -1.0, -1.5], kl_coef=0.5
    )
    assert adjusted == pytest.approx([0.9, 1.0, 0.25])


def test_kl_adjust_advantages_kl_coef_is_keyword_only_and_lengths_must_match():
    with pytest.raises(TypeError):
        kl_adjust_advantages([1.0], [0.0], [0.0], 0.5)
    with pytest.raises(ValueError, match="zip"):
        kl_adjust_advantages([1.0, 2.0], [0.0], [0.0, 0.0], kl_coef=0.1)
