"""Wire strictness: request models refuse, naming the field; response models keep extras."""

import math

import pytest
from pydantic import ValidationError

from whitney import wire
from whitney.datums import rl_datum, sft_datum


def payload(*data, loss_function="importance_sampling", loss_config=None):
    return {"data": list(data), "loss_function": loss_function, "loss_config": loss_config or {}}


def refusals(model, value):
    """Every (location, message) of the ValidationError `model` raises for `value`."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(value)
    return [(error["loc"], error["msg"]) for error in caught.value.errors()]


def good():
    return rl_datum([1, 2], [3, 4, 5], [-0.5, -0.25, -1.0], 1.0)


def test_the_helpers_output_is_valid():
    wire.ForwardPayload.model_validate(payload(good(), sft_datum([4], [5, 6])))


def test_tensor_values_must_match_its_shape():
    bad = good()
    bad["loss_inputs"]["weights"]["values"].pop()
    errors = refusals(wire.ForwardPayload, payload(good(), bad))
    assert errors == [
        (("data", 1, "loss_inputs", "weights"), "Value error, has 3 values but shape [4]")
    ]


def test_int64_tensor_refuses_float_values():
    bad = good()
    bad["loss_inputs"]["target_tokens"]["values"] = [2.0, 3.0, 4.0, 5.5]
    errors = refusals(wire.ForwardPayload, payload(bad))
    assert errors == [
        (
            ("data", 0, "loss_inputs", "target_tokens"),
            "Value error, dtype int64 needs integer values",
        )
    ]


@pytest.mark.parametrize("intruder", [True, "0.5", None])
def test_float32_tensor_refuses_non_numbers(intruder):
    bad = good()
    bad["loss_inputs"]["advantages"]["values"][2] = intruder
    errors = refusals(wire.ForwardPayload, payload(bad))
    assert errors
    assert all(loc[:5] == ("data", 0, "loss_inputs", "advantages", "values") for loc, _ in errors)


def test_tensor_shape_must_be_one_dimension():
    bad = good()
    bad["loss_inputs"]["weights"]["shape"] = [2, 2]
    errors = refusals(wire.ForwardPayload, payload(bad))
    assert errors[0][0] == ("data", 0, "loss_inputs", "weights", "shape")


def test_datum_tensor_lengths_must_match_token_ids():
    bad = sft_datum([1, 2, 3], [4])
    bad["input"]["token_ids"].append(9)
    errors = refusals(wire.ForwardPayload, payload(good(), good(), bad))
    assert errors == [
        (
            ("data", 2),
            "Value error, loss_inputs.target_tokens has shape [3] but input.token_ids has 4 tokens",
        )
    ]


def test_forward_payload_refuses_empty_data():
    errors = refusals(wire.ForwardPayload, payload())
    assert [loc for loc, _ in errors] == [("data",)]
    assert "at least 1 item" in errors[0][1]


@pytest.mark.parametrize("bad_value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_in_a_tensor_name_the_datum_and_tensor(bad_value):
    bad = good()
    bad["loss_inputs"]["logprobs"]["values"][1] = bad_value
    errors = refusals(wire.ForwardPayload, payload(good(), bad))
    finite = [loc for loc, msg in errors if msg == "Input should be a finite number"]
    assert finite == [("data", 1, "loss_inputs", "logprobs", "values", "list[float]", 1)]


@pytest.mark.parametrize("bad_value", [math.nan, math.inf])
def test_nan_and_infinity_in_loss_config_and_optimizer(bad_value):
    errors = refusals(
        wire.ForwardPayload, payload(good(), loss_config={"clip_low_threshold": bad_value})
    )
    assert errors == [(("loss_config", "clip_low_threshold"), "Input should be a finite number")]
    errors = refusals(wire.OptimStepPayload, {"optimizer": {"learning_rate": bad_value}})
    assert errors == [(("optimizer", "learning_rate"), "Input should be a finite number")]


def test_request_models_refuse_unknown_fields():
    errors = refusals(wire.ForwardPayload, {**payload(good()), "loss_fn": "ppo"})
    assert errors == [(("loss_fn",), "Extra inputs are not permitted")]
    bad = good()
    bad["input"]["position_ids"] = [0, 1, 2, 3]
    errors = refusals(wire.ForwardPayload, payload(bad))
    assert errors == [(("data", 0, "input", "position_ids"), "Extra inputs are not permitted")]


def test_token_ids_must_be_non_negative_integers():
    bad = good()
    bad["input"]["token_ids"][0] = -1
    errors = refusals(wire.ForwardPayload, payload(bad))
    assert errors[0][0] == ("data", 0, "input", "token_ids", 0)


def test_validate_payload_picks_the_kinds_model():
    assert isinstance(wire.validate_payload("export_lora", {}), wire.EmptyPayload)
    assert isinstance(wire.validate_payload("forward", payload(good())), wire.ForwardPayload)
    with pytest.raises(ValidationError):
        wire.validate_payload("export_lora", {"format": "peft"})
    with pytest.raises(ValueError, match="unknown operation kind 'train'"):
        wire.validate_payload("train", {})


def test_response_models_keep_unknown_fields():
    operation = wire.Operation.model_validate(
        {
            "run_id": "r",
            "seq_id": 1,
            "kind": "sample",
            "sampler_id": "s",
            "status": "succeeded",
            "result": {"sequences": []},
            "usage": {"tokens": 12, "gpu_seconds": 0.25},
            "region": "eu-west",
        }
    )
    assert operation.model_extra == {"region": "eu-west"}
    assert operation.usage == {"tokens": 12, "gpu_seconds": 0.25}
    capabilities = wire.Capabilities.model_validate(
        {
            "api_version": "1",
            "providers": {
                "local": {
                    "base_models": ["tiny"],
                    "max_lora_rank": 64,
                    "run_operations": ["forward"],
                    "sampler_operations": ["sample"],
                    "regions": ["here"],
                }
            },
            "build": "abc",
        }
    )
    assert capabilities.model_extra == {"build": "abc"}
    assert capabilities.providers["local"].model_extra == {"regions": ["here"]}
    run = wire.Run.model_validate(
        {
            "run_id": "r",
            "session_id": "s",
            "provider": "local",
            "base_model": "tiny",
            "lora_rank": 8,
            "role": "policy",
            "trainable": True,
            "status": "ready",
            "next_seq_id": 1,
            "step": 0,
            "created_at": "2025-01-01T00:00:00Z",
            "labels": {"a": "b"},
        }
    )
    assert run.model_extra == {"labels": {"a": "b"}}
