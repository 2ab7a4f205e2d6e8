"""forward_backward_payload (the page's) and the payload helpers the page uses unshown."""

import math

import pytest
from pydantic import ValidationError

from whitney import wire
from whitney.datums import sft_datum
from whitney.payloads import (
    adamw_optimizer,
    forward_backward_payload,
    result_sampler_id,
    sample_request,
)


def test_forward_backward_payload_assembles_the_forward_payload():
    data = [sft_datum([1, 2], [3])]
    config = {"clip_low_threshold": 0.8}
    payload = forward_backward_payload(data, "ppo", config)
    assert payload == {
        "data": data,
        "loss_function": "ppo",
        "loss_config": {"clip_low_threshold": 0.8},
    }
    assert payload["data"] is data
    assert payload["loss_config"] is not config
    assert forward_backward_payload(data, "cross_entropy")["loss_config"] == {}
    wire.ForwardPayload.model_validate(payload)


def test_forward_backward_payload_refuses_empty_data():
    with pytest.raises(ValueError) as caught:
        forward_backward_payload([], "cross_entropy")
    assert str(caught.value) == "forward_backward_payload needs at least one datum"


def test_adamw_optimizer_defaults():
    assert adamw_optimizer(1e-6) == {
        "type": "adamw",
        "learning_rate": 1e-6,
        "beta1": 0.9,
        "beta2": 0.95,
        "eps": 1e-8,
        "weight_decay": 0.0,
        "grad_clip_norm": 0.0,
    }
    # the page's skeleton calls it by keyword, inside an optim_step payload
    wire.validate_payload("optim_step", {"optimizer": adamw_optimizer(learning_rate=1e-6)})


def test_adamw_optimizer_overrides():
    optimizer = adamw_optimizer(3e-4, beta2=0.999, weight_decay=0.01, grad_clip_norm=1.0)
    assert optimizer == {
        "type": "adamw",
        "learning_rate": 3e-4,
        "beta1": 0.9,
        "beta2": 0.999,
        "eps": 1e-8,
        "weight_decay": 0.01,
        "grad_clip_norm": 1.0,
    }


def test_adamw_optimizer_refuses_an_unknown_override_by_name():
    with pytest.raises(ValueError, match="'momentum'"):
        adamw_optimizer(1e-4, momentum=0.9)
    with pytest.raises(ValueError, match="'type'"):
        adamw_optimizer(1e-4, type="sgd")


@pytest.mark.parametrize(
    ("learning_rate", "overrides", "field"),
    [
        (math.nan, {}, "learning_rate"),
        (-1.0, {}, "learning_rate"),
        (1e-4, {"beta1": 1.5}, "beta1"),
        (1e-4, {"eps": 0.0}, "eps"),
        (1e-4, {"grad_clip_norm": math.inf}, "grad_clip_norm"),
    ],
)
def test_adamw_optimizer_refuses_invalid_values(learning_rate, overrides, field):
    with pytest.raises(ValidationError) as caught:
        adamw_optimizer(learning_rate, **overrides)
    assert caught.value.errors()[0]["loc"] == (field,)


def test_result_sampler_id():
    assert result_sampler_id({"sampler_id": "sampler-3"}) == "sampler-3"
    assert result_sampler_id(wire.SamplerResult(sampler_id="s-1")) == "s-1"
    operation = wire.Operation.model_validate(
        {
            "run_id": "r",
            "seq_id": 4,
            "kind": "save_weights_for_sampler",
            "status": "succeeded",
            "result": {"sampler_id": "named"},
        }
    )
    assert result_sampler_id(operation) == "named"


@pytest.mark.parametrize(
    "result", [{}, {"sampler_id": ""}, {"sampler_id": None}, {"checkpoint": "x"}, None, "s-1"]
)
def test_result_sampler_id_without_one_is_a_clear_error(result):
    with pytest.raises(ValueError, match="sampler_id|save_weights_for_sampler"):
        result_sampler_id(result)


def test_result_sampler_id_refuses_another_kind_of_operation():
    operation = wire.Operation.model_validate(
        {"run_id": "r", "seq_id": 4, "kind": "save_state", "status": "succeeded", "result": {}}
    )
    with pytest.raises(ValueError, match="'save_state' operation"):
        result_sampler_id(operation)


def test_sample_request_fills_the_defaults():
    assert sample_request([1, 2, 3], 4, max_tokens=16) == {
        "prompt": {"token_ids": [1, 2, 3]},
        "num_samples": 4,
        "sampling_params": {
            "max_tokens": 16,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": None,
            "stop_token_ids": [],
            "stop": [],
            "seed": None,
        },
    }


def test_sample_request_takes_every_sampling_parameter():
    request = sample_request(
        (5,),
        2,
        max_tokens=8,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        stop_token_ids=[0],
        stop=["\n\nUser:"],
        seed=11,
    )
    assert request["sampling_params"] == {
        "max_tokens": 8,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "stop_token_ids": [0],
        "stop": ["\n\nUser:"],
        "seed": 11,
    }
    assert request["prompt"] == {"token_ids": [5]}
    wire.validate_payload("sample", request)


def test_sample_request_needs_max_tokens():
    with pytest.raises(ValueError, match="max_tokens"):
        sample_request([1, 2], 4)


def test_sample_request_refuses_an_unknown_parameter_by_name():
    with pytest.raises(ValueError, match="'temp'"):
        sample_request([1, 2], 4, max_tokens=8, temp=0.5)


@pytest.mark.parametrize(
    ("prompt", "num_samples", "params", "loc"),
    [
        ([], 4, {"max_tokens": 8}, ("prompt", "token_ids")),
        ([1], 0, {"max_tokens": 8}, ("num_samples",)),
        ([1], 1, {"max_tokens": 0}, ("sampling_params", "max_tokens")),
        ([1], 1, {"max_tokens": 8, "temperature": 0.0}, ("sampling_params", "temperature")),
        ([1], 1, {"max_tokens": 8, "top_p": 1.5}, ("sampling_params", "top_p")),
        ([-1], 1, {"max_tokens": 8}, ("prompt", "token_ids", 0)),
    ],
)
def test_sample_request_refuses_invalid_values(prompt, num_samples, params, loc):
    with pytest.raises(ValidationError) as caught:
        sample_request(prompt, num_samples, **params)
    assert caught.value.errors()[0]["loc"] == loc
