"""The page's datum helpers, against values worked out by hand."""

import pytest
from pydantic import ValidationError

from whitney import wire
from whitney.datums import _aligned, _rightshift, rl_datum, sft_datum, tensor


def test_tensor_builds_a_dense_tensor_with_its_shape():
    assert tensor("int64", [7, 8, 9]) == {"dtype": "int64", "shape": [3], "values": [7, 8, 9]}
    assert tensor("float32", []) == {"dtype": "float32", "shape": [0], "values": []}


def test_tensor_copies_its_values_into_a_list():
    source = (0.5, 1.5)
    built = tensor("float32", source)
    assert built["values"] == [0.5, 1.5]
    assert type(built["values"]) is list
    values = [1, 2]
    assert tensor("int64", values)["values"] is not values


def test_rightshift_and_aligned():
    assert _rightshift([1, 2, 3], [4, 5]) == ([1, 2, 3, 4], [2, 3, 4, 5], 2)
    assert _aligned(2, [1.0, 1.0]) == [0.0, 0.0, 1.0, 1.0]
    assert _aligned(0, [0.5]) == [0.5]


def test_sft_datum_masks_the_prompt_and_supervises_the_completion():
    # full = 10 11 12 | 20 21 ; inputs drop the last token, targets drop the first.
    datum = sft_datum([10, 11, 12], [20, 21])
    assert datum == {
        "input": {"token_ids": [10, 11, 12, 20]},
        "loss_inputs": {
            "target_tokens": {"dtype": "int64", "shape": [4], "values": [11, 12, 20, 21]},
            "weights": {"dtype": "float32", "shape": [4], "values": [0.0, 0.0, 1.0, 1.0]},
        },
    }
    wire.Datum.model_validate(datum)


def test_sft_datum_smallest_cases():
    assert sft_datum([5], [6]) == {
        "input": {"token_ids": [5]},
        "loss_inputs": {
            "target_tokens": {"dtype": "int64", "shape": [1], "values": [6]},
            "weights": {"dtype": "float32", "shape": [1], "values": [1.0]},
        },
    }
    # No completion: every position is prompt, so nothing is supervised.
    assert sft_datum([1, 2], [])["loss_inputs"]["weights"]["values"] == [0.0]


@pytest.mark.parametrize(("prompt", "completion"), [([1], []), ([], [7]), ([], [])])
def test_sft_datum_needs_two_tokens(prompt, completion):
    with pytest.raises(ValueError) as caught:
        sft_datum(prompt, completion)
    assert str(caught.value) == "prompt_tokens + completion_tokens must contain at least two tokens"


def test_rl_datum_broadcasts_a_scalar_advantage():
    # full = 1 2 | 3 4 5 ; pad_len = 1 (the first target, 3, is the first completion token)
    datum = rl_datum([1, 2], [3, 4, 5], [-0.5, -0.25, -1.0], 2.0)
    assert datum == {
        "input": {"token_ids": [1, 2, 3, 4]},
        "loss_inputs": {
            "target_tokens": {"dtype": "int64", "shape": [4], "values": [2, 3, 4, 5]},
            "weights": {"dtype": "float32", "shape": [4], "values": [0.0, 1.0, 1.0, 1.0]},
            "logprobs": {"dtype": "float32", "shape": [4], "values": [0.0, -0.5, -0.25, -1.0]},
            "advantages": {"dtype": "float32", "shape": [4], "values": [0.0, 2.0, 2.0, 2.0]},
        },
    }
    wire.Datum.model_validate(datum)


def test_rl_datum_int_advantage_becomes_float():
    values = rl_datum([1, 2], [3, 4], [-1.0, -2.0], 3)["loss_inputs"]["advantages"]["values"]
    assert values == [0.0, 3.0, 3.0]
    assert all(type(value) is float for value in values)


def test_rl_datum_takes_a_per_token_advantage_list():
    datum = rl_datum([9], [3, 4, 5], [-0.1, -0.2, -0.3], [0.5, -1, 2])
    assert datum["input"]["token_ids"] == [9, 3, 4]
    assert datum["loss_inputs"]["advantages"]["values"] == [0.5, -1.0, 2.0]
    assert datum["loss_inputs"]["weights"]["values"] == [1.0, 1.0, 1.0]


def test_rl_datum_clip_tensors_are_aligned_and_optional():
    both = rl_datum([1, 2], [3, 4, 5], [-0.5, -0.25, -1.0], 1.0, clip_low=0.8, clip_high=1.2)
    assert both["loss_inputs"]["clip_low_threshold"] == {
        "dtype": "float32",
        "shape": [4],
        "values": [0.0, 0.8, 0.8, 0.8],
    }
    assert both["loss_inputs"]["clip_high_threshold"] == {
        "dtype": "float32",
        "shape": [4],
        "values": [0.0, 1.2, 1.2, 1.2],
    }
    low_only = rl_datum([1, 2], [3], [-0.5], 1.0, clip_low=0.9)
    assert sorted(low_only["loss_inputs"]) == [
        "advantages",
        "clip_low_threshold",
        "logprobs",
        "target_tokens",
        "weights",
    ]
    neither = rl_datum([1, 2], [3], [-0.5], 1.0)
    assert sorted(neither["loss_inputs"]) == ["advantages", "logprobs", "target_tokens", "weights"]


def test_rl_datum_refuses_mismatched_logprobs():
    with pytest.raises(ValueError) as caught:
        rl_datum([1, 2], [3, 4, 5], [-0.5, -0.25], 1.0)
    assert str(caught.value) == "sampled_logprobs must have one entry per sampled_tokens element"


def test_rl_datum_needs_two_tokens():
    with pytest.raises(ValueError) as caught:
        rl_datum([], [3], [-0.5], 1.0)
    assert str(caught.value) == "prompt_tokens + completion_tokens must contain at least two tokens"


def test_empty_prompt_datum_is_misaligned_and_the_wire_model_refuses_it():
    # The page's helpers assume a non-empty prompt: with none, pad_len is -1 and the weights
    # keep one entry per completion token, one more than the inputs. wire.Datum (and so the
    # client, before sending) refuses such a datum.
    datum = sft_datum([], [1, 2, 3])
    assert datum["input"]["token_ids"] == [1, 2]
    assert datum["loss_inputs"]["weights"]["values"] == [1.0, 1.0, 1.0]
    with pytest.raises(ValidationError, match="loss_inputs.weights has shape"):
        wire.Datum.model_validate(datum)
