"""The page's provider tables, require_advertised_loss, and validate_loss_config."""

import pytest

from whitney.datums import rl_datum, sft_datum
from whitney.errors import InvalidDatum, InvalidLossConfig, UnsupportedLoss
from whitney.losses import (
    MODAL_LOSS_CONFIG_KEYS,
    PROVIDER_LOSS_SUPPORT,
    require_advertised_loss,
    validate_loss_config,
)

SFT = [sft_datum([1, 2], [3, 4])]
RL = [rl_datum([1, 2], [3, 4], [-0.5, -1.0], 1.0), rl_datum([1], [5, 6], [-0.1, -0.2], -1.0)]
RL_CLIPPED = [
    rl_datum([1, 2], [3, 4], [-0.5, -1.0], 1.0),
    rl_datum([1], [5, 6], [-0.1, -0.2], -1.0, clip_low=0.8, clip_high=1.2),
]


def critic_datum():
    def values(xs):
        return {"dtype": "float32", "shape": [len(xs)], "values": xs}

    return {
        "input": {"token_ids": [1, 2, 3]},
        "loss_inputs": {
            "values": values([0.0, 0.1, 0.2]),
            "returns": values([0.0, 1.0, 1.0]),
            "weights": values([0.0, 1.0, 1.0]),
        },
    }


POLICY_LOSSES = {"importance_sampling", "ppo", "cispo", "dro", "gspo", "dppo"}
EIGHT_LOSSES = POLICY_LOSSES | {"cross_entropy", "ppo_critic"}


def test_provider_loss_support_is_the_pages_table():
    """The page: Modal serves every loss but `dro`; Tinker serves `dro` and none of the
    sequence, critic and divergence losses."""
    assert PROVIDER_LOSS_SUPPORT["modal"] == EIGHT_LOSSES - {"dro"}
    assert PROVIDER_LOSS_SUPPORT["tinker"] == EIGHT_LOSSES - {"gspo", "ppo_critic", "dppo"}


def test_modal_loss_config_keys_are_the_pages_table():
    """The page's table read by key: which losses Modal validates each key for."""
    takers = {
        "clip_low_threshold": {"ppo", "cispo", "gspo"},
        "clip_high_threshold": {"ppo", "cispo", "gspo"},
        "value_clip": {"ppo", "ppo_critic"},
        "delta_low": {"dppo"},
        "delta_high": {"dppo"},
    }
    assert set(MODAL_LOSS_CONFIG_KEYS) == EIGHT_LOSSES - {"dro"}
    for key, losses in takers.items():
        assert {loss for loss, keys in MODAL_LOSS_CONFIG_KEYS.items() if key in keys} == losses
    assert set().union(*MODAL_LOSS_CONFIG_KEYS.values()) == set(takers)


@pytest.mark.parametrize(
    ("provider", "loss"),
    [
        ("modal", "cross_entropy"),
        ("modal", "importance_sampling"),
        ("modal", "ppo"),
        ("modal", "cispo"),
        ("modal", "gspo"),
        ("modal", "ppo_critic"),
        ("modal", "dppo"),
        ("tinker", "cross_entropy"),
        ("tinker", "importance_sampling"),
        ("tinker", "ppo"),
        ("tinker", "cispo"),
        ("tinker", "dro"),
    ],
)
def test_require_advertised_loss_accepts_the_tables_entries(provider, loss):
    assert require_advertised_loss(provider, loss, PROVIDER_LOSS_SUPPORT) is None


def test_require_advertised_loss_refuses_an_unadvertised_loss():
    with pytest.raises(ValueError) as caught:
        require_advertised_loss("modal", "dro", PROVIDER_LOSS_SUPPORT)
    assert str(caught.value) == (
        "modal does not advertise loss_function='dro' (known losses: cispo, cross_entropy, "
        "dppo, gspo, importance_sampling, ppo, ppo_critic)"
    )
    with pytest.raises(ValueError) as caught:
        require_advertised_loss("tinker", "gspo", PROVIDER_LOSS_SUPPORT)
    assert str(caught.value) == (
        "tinker does not advertise loss_function='gspo' "
        "(known losses: cispo, cross_entropy, dro, importance_sampling, ppo)"
    )


def test_require_advertised_loss_refuses_an_unknown_provider():
    with pytest.raises(ValueError) as caught:
        require_advertised_loss("openai", "ppo", PROVIDER_LOSS_SUPPORT)
    assert str(caught.value) == "Unknown provider 'openai'"


# -- validate_loss_config: refusals ---------------------------------------------------------


def test_validate_loss_config_refuses_an_unknown_provider():
    with pytest.raises(ValueError, match="Unknown provider 'openai'"):
        validate_loss_config("openai", "ppo", {}, RL)


@pytest.mark.parametrize(
    ("provider", "loss"),
    [("modal", "dro"), ("tinker", "gspo"), ("tinker", "ppo_critic"), ("local", "sft")],
)
def test_validate_loss_config_refuses_an_unsupported_loss(provider, loss):
    with pytest.raises(UnsupportedLoss) as caught:
        validate_loss_config(provider, loss, {}, RL)
    assert caught.value.status == 422
    assert f"loss_function={loss!r}" in caught.value.message
    assert caught.value.details == {"loss_function": loss, "provider": provider}


@pytest.mark.parametrize(
    ("provider", "loss", "config", "key"),
    [
        ("modal", "ppo", {"beta": 0.1}, "beta"),
        ("modal", "cross_entropy", {"clip_low_threshold": 0.8}, "clip_low_threshold"),
        ("modal", "gspo", {"value_clip": 0.2}, "value_clip"),
        ("modal", "dppo", {"clip_high_threshold": 1.2}, "clip_high_threshold"),
        ("tinker", "ppo", {"value_clip": 0.2}, "value_clip"),
        ("tinker", "importance_sampling", {"beta": 0.05}, "beta"),
        ("local", "cross_entropy", {"beta": 0.05}, "beta"),
    ],
)
def test_validate_loss_config_refuses_an_unknown_key(provider, loss, config, key):
    with pytest.raises(InvalidLossConfig) as caught:
        validate_loss_config(provider, loss, config, SFT if loss == "cross_entropy" else RL)
    assert caught.value.status == 422
    assert caught.value.message.startswith(f"loss_config.{key} is not accepted by {provider}")
    assert caught.value.details == {"key": key}


@pytest.mark.parametrize("key", ["clip_low_threshold", "clip_high_threshold"])
def test_validate_loss_config_refuses_tinker_clip_keys_pointing_to_the_tensors(key):
    with pytest.raises(InvalidLossConfig) as caught:
        validate_loss_config("tinker", "ppo", {key: 1.0}, RL)
    assert caught.value.message == (
        f"loss_config.{key} is not accepted by tinker: set the clip range per token with the "
        "clip_low_threshold / clip_high_threshold loss_inputs tensors"
    )


def test_validate_loss_config_refuses_per_token_clip_tensors_on_modal():
    with pytest.raises(InvalidDatum) as caught:
        validate_loss_config("modal", "ppo", {}, RL_CLIPPED)
    assert caught.value.message.startswith("data[1].loss_inputs.clip_low_threshold:")
    assert caught.value.details == {"datum": 1, "tensor": "clip_low_threshold"}


@pytest.mark.parametrize(
    ("provider", "loss", "data", "missing"),
    [
        ("modal", "importance_sampling", SFT, "logprobs"),
        ("tinker", "ppo", SFT, "logprobs"),
        ("modal", "ppo_critic", RL, "values"),
        (
            "tinker",
            "cross_entropy",
            [{"input": {"token_ids": [1]}, "loss_inputs": {}}],
            "target_tokens",
        ),
    ],
)
def test_validate_loss_config_refuses_a_missing_required_tensor(provider, loss, data, missing):
    with pytest.raises(InvalidDatum) as caught:
        validate_loss_config(provider, loss, {}, data)
    assert caught.value.message == (
        f"data[0].loss_inputs.{missing} is required by loss_function={loss!r}"
    )
    assert caught.value.details == {"datum": 0, "tensor": missing}


# -- validate_loss_config: acceptances ------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "loss", "config", "data"),
    [
        ("modal", "cross_entropy", {}, SFT),
        ("tinker", "cross_entropy", None, SFT),
        ("local", "cross_entropy", {}, SFT),
        ("modal", "importance_sampling", {}, RL),
        (
            "modal",
            "ppo",
            {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "value_clip": 0.2},
            RL,
        ),
        ("modal", "gspo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, RL),
        ("modal", "cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}, RL),
        ("modal", "dppo", {"delta_low": 0.2, "delta_high": 0.2}, RL),
        ("modal", "ppo_critic", {"value_clip": 0.2}, [critic_datum()]),
        ("tinker", "dro", {"beta": 0.05}, RL),
        ("tinker", "ppo", {}, RL_CLIPPED),
        ("tinker", "cispo", {}, RL_CLIPPED),
        ("local", "ppo", {"clip_low_threshold": 0.8}, RL_CLIPPED),
        ("local", "dro", {"beta": 0.05}, RL),
        ("local", "dppo", {"delta_low": 0.1}, RL),
    ],
)
def test_validate_loss_config_accepts(provider, loss, config, data):
    assert validate_loss_config(provider, loss, config, data) is None
