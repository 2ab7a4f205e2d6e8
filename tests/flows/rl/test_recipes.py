"""The build_loss recipes on their own: a recipe per loss, clip bounds placed per provider,
each loss's keys, GSPO's mask, GAE and the critic's calls, the reference KL, and the config
check that refuses before allocation. Numbers are computed by hand."""

from __future__ import annotations

from typing import Any

import flowtest_recipe_helpers
import pytest

from flows.core.config import ConfigError
from flows.rl import recipes
from flows.rl.config import RLConfig
from flows.rl.plan import DryRunClient, check_rl_config, probe
from flows.rl.recipes import (
    CRITIC_PROVIDERS,
    RECIPES,
    AuxiliaryRun,
    Recipe,
    load_recipe,
)
from flows.rl.recipes.context import LossContext
from flows.rl.recipes.importance_sampling import build_loss as importance_sampling
from flows.rl.recipes.ppo_critic import CriticSettings, gae, whiten
from flows.rl.recipes.reference_kl import ReferenceKLSettings, with_reference_kl
from whitney.local.providers import CRITIC_PROVIDERS as SERVER_CRITIC_PROVIDERS
from whitney.losses import LOSS_FUNCTIONS, validate_loss_config
from whitney.payloads import sample_request

PROMPT = [1, 2, 3]
SEQUENCES = [
    {"tokens": [10, 11], "logprobs": [-0.5, -1.0], "stop_reason": "stop"},
    {"tokens": [12, 13, 14], "logprobs": [-2.0, -0.25, -1.5], "stop_reason": "length"},
]
REQUEST = sample_request(PROMPT, 2, max_tokens=3)
SAMPLE = {"sequences": SEQUENCES, "prompt_tokens": len(PROMPT)}
PAD = len(PROMPT) - 1


def values(datum: dict, name: str) -> list[float]:
    return datum["loss_inputs"][name]["values"]


def context(
    provider: str = "local",
    loss_config: dict[str, float] | None = None,
    client: Any = None,
    runs: dict[str, Any] | None = None,
    rewards: list[float] | None = None,
    advantages: list[float] | None = None,
) -> LossContext:
    return LossContext(
        client=client or DryRunClient(eos_id=0),
        run_id="policy",
        sampler_id="sampler",
        provider=provider,
        loss_config=loss_config or {},
        rewards=rewards or [1.0, 0.0],
        advantages=advantages or [0.5, -0.5],
        runs=runs or {},
        scratch={},
    )


class Ref:
    def __init__(self, run_id: str, sampler_id: str | None = None) -> None:
        self.run_id, self.sampler_id = run_id, sampler_id


def test_every_loss_has_a_recipe() -> None:
    assert set(RECIPES) == set(LOSS_FUNCTIONS)
    for loss in LOSS_FUNCTIONS:
        recipe = load_recipe(loss)
        assert recipe.loss_settings is not None
        assert recipe.loss_function == ("ppo" if loss == "ppo_critic" else loss)
    assert load_recipe("ppo_critic").auxiliary_runs == (AuxiliaryRun("critic", role="critic"),)
    with pytest.raises(ValueError, match="no build_loss recipe for loss 'nope'"):
        load_recipe("nope")


def test_critic_providers_match_the_server() -> None:
    assert CRITIC_PROVIDERS == SERVER_CRITIC_PROVIDERS


@pytest.mark.parametrize("loss", ["ppo", "cispo", "gspo"])
@pytest.mark.parametrize("provider", ["tinker", "modal", "local"])
def test_clip_bounds_go_where_the_provider_takes_them(loss: str, provider: str) -> None:
    recipe = load_recipe(loss)
    payload = recipe.build_loss(SAMPLE, 0, REQUEST, context(provider, {"clip_low_threshold": 0.5}))
    high = {"ppo": 1.2, "cispo": 4.0, "gspo": 1.2}[loss]
    if provider == "tinker":
        assert payload["loss_config"] == {}
        for datum, sequence in zip(payload["data"], SEQUENCES, strict=True):
            n = len(sequence["tokens"])
            assert values(datum, "clip_low_threshold") == [0.0] * PAD + [0.5] * n
            assert values(datum, "clip_high_threshold") == [0.0] * PAD + [high] * n
    else:
        assert payload["loss_config"] == {"clip_low_threshold": 0.5, "clip_high_threshold": high}
        for datum in payload["data"]:
            assert "clip_low_threshold" not in datum["loss_inputs"]
    if loss in {"ppo", "cispo"} or provider != "tinker":
        validate_loss_config(
            provider, payload["loss_function"], payload["loss_config"], payload["data"]
        )


def test_scalar_keys_of_dro_and_dppo() -> None:
    dro = load_recipe("dro").build_loss(SAMPLE, 0, REQUEST, context("tinker", {"beta": 0.1}))
    assert dro["loss_function"] == "dro" and dro["loss_config"] == {"beta": 0.1}
    dppo = load_recipe("dppo").build_loss(SAMPLE, 0, REQUEST, context("modal", {"delta_low": 0.1}))
    assert dppo["loss_config"] == {"delta_low": 0.1, "delta_high": 0.2}
    for datum, advantage in zip(dppo["data"], [0.5, -0.5], strict=True):
        assert set(values(datum, "advantages")[PAD:]) == {advantage}
        assert "clip_low_threshold" not in datum["loss_inputs"]


def test_gspo_sends_its_sequence_ratio_mask() -> None:
    payload = load_recipe("gspo").build_loss(SAMPLE, 0, REQUEST, context("modal"))
    for datum, sequence in zip(payload["data"], SEQUENCES, strict=True):
        mask = values(datum, "sequence_ratio_mask")
        assert len(mask) == len(datum["input"]["token_ids"])
        assert mask == [0.0] * PAD + [1.0] * len(sequence["tokens"])
        assert mask == values(datum, "weights")


def test_cross_entropy_supervises_the_better_than_baseline_sequences() -> None:
    payload = load_recipe("cross_entropy").build_loss(
        SAMPLE, 0, REQUEST, context(advantages=[0.5, -0.5])
    )
    assert payload["loss_function"] == "cross_entropy" and payload["loss_config"] == {}
    better, worse = payload["data"]
    assert values(better, "weights") == [0.0] * PAD + [1.0, 1.0]
    assert values(worse, "weights") == [0.0] * (PAD + 3)
    assert set(better["loss_inputs"]) == {"target_tokens", "weights"}


def test_importance_sampling_is_unchanged() -> None:
    payload = importance_sampling(SAMPLE, 0, REQUEST, context())
    assert payload["loss_function"] == "importance_sampling" and payload["loss_config"] == {}
    assert values(payload["data"][1], "logprobs") == [0.0] * PAD + [-2.0, -0.25, -1.5]
    assert values(payload["data"][1], "advantages") == [0.0] * PAD + [-0.5] * 3


def test_gae_by_hand() -> None:
    # gamma = lambda = 1: every advantage is the reward minus the value at that token
    advantages, returns = gae(1.0, [0.25, 0.5, 0.75], gamma=1.0, lam=1.0)
    assert advantages == pytest.approx([0.75, 0.5, 0.25])
    assert returns == pytest.approx([1.0, 1.0, 1.0])
    # gamma 0.5, lambda 0.5: deltas d2 = 1 - 0.75, d1 = 0.5*0.75 - 0.5, d0 = 0.5*0.5 - 0.25
    advantages, returns = gae(1.0, [0.25, 0.5, 0.75], gamma=0.5, lam=0.5)
    d2, d1, d0 = 0.25, -0.125, 0.0
    a2 = d2
    a1 = d1 + 0.25 * a2
    a0 = d0 + 0.25 * a1
    assert advantages == pytest.approx([a0, a1, a2])
    assert returns == pytest.approx([a0 + 0.25, a1 + 0.5, a2 + 0.75])


def test_whiten() -> None:
    first, second = whiten([[1.0, 3.0], [2.0]])  # mean 2, std sqrt(2/3)
    assert first == pytest.approx([-(1.5**0.5), 1.5**0.5])
    assert second == [0.0]
    assert whiten([[2.0], [2.0]]) == [[0.0], [0.0]]


class CriticClient(DryRunClient):
    """A dry-run client whose critic answers values 0.1 * position."""

    def run_operation(self, run_id, kind, payload, *, seq_id=None):  # type: ignore[no-untyped-def]
        result = super().run_operation(run_id, kind, payload, seq_id=seq_id)
        if kind == "forward":
            lengths = [len(datum["input"]["token_ids"]) for datum in payload["data"]]
            result["outputs"] = [{"values": [0.1 * t for t in range(n)]} for n in lengths]
        if kind == "forward_backward":
            result = {"loss": 0.25, "metrics": {"values_clipfrac:mean": 0.0}, "outputs": []}
        if kind == "optim_step":
            result = {"step": 1, "metrics": {"grad_norm": 2.0}}
        return result


def test_critic_recipe_calls_and_advantages() -> None:
    recipe = load_recipe("ppo_critic").bind_options(
        CriticSettings(gamma=1.0, gae_lambda=1.0, normalize_advantages=False, learning_rate=0.01)
    )
    client = CriticClient(eos_id=0)
    ctx = context(
        "modal", {"value_clip": 0.5}, client, {"critic": Ref("critic-run")}, rewards=[1.0, 0.0]
    )
    payload = recipe.build_loss(SAMPLE, 0, REQUEST, ctx)
    assert payload["loss_function"] == "ppo"
    assert payload["loss_config"] == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    (forward,) = [call for call in client.calls if call[1] == "forward"]
    assert forward[0] == "critic-run"
    assert forward[2]["loss_function"] == "ppo_critic"
    assert forward[2]["loss_config"] == {"value_clip": 0.5}
    # values before completion token j are 0.1 * (PAD + j); gamma = lambda = 1: A = R - V
    first, second = payload["data"]
    assert values(first, "advantages")[PAD:] == pytest.approx([1 - 0.2, 1 - 0.3])
    assert values(second, "advantages")[PAD:] == pytest.approx([-0.2, -0.3, -0.4])

    metrics = recipe.finish_cycle(0, ctx)  # type: ignore[misc]
    assert metrics == {"value_loss": 0.25, "values_clipfrac": 0.0, "critic_grad_norm": 2.0}
    kinds = [(run_id, kind) for run_id, kind, _ in client.calls]
    assert kinds == [
        ("critic-run", "forward"),
        ("critic-run", "forward_backward"),
        ("critic-run", "optim_step"),
    ]
    backward, optimized = client.calls[1][2], client.calls[2][2]
    assert backward["loss_function"] == "ppo_critic"
    critic_first = backward["data"][0]
    assert values(critic_first, "values") == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert values(critic_first, "returns")[PAD:] == pytest.approx([1.0, 1.0])
    assert values(critic_first, "weights") == [0.0] * PAD + [1.0, 1.0]
    assert optimized["optimizer"]["learning_rate"] == 0.01


class ReferenceClient(DryRunClient):
    """A dry-run client whose reference answers logprob -1.0 for every token."""


@pytest.mark.parametrize("length_normalize", [False, True])
def test_reference_kl_adjusts_each_token(length_normalize: bool) -> None:
    settings = ReferenceKLSettings(enabled=True, kl_coef=0.5, length_normalize=length_normalize)
    recipe = with_reference_kl(load_recipe("importance_sampling"), settings)
    assert recipe.auxiliary_runs == (AuxiliaryRun("reference", trainable=False, sampler=True),)
    client = ReferenceClient(eos_id=0)
    ctx = context(client=client, runs={"reference": Ref("ref-run", "reference")})
    payload = recipe.build_loss(SAMPLE, 0, REQUEST, ctx)
    ((run_id, kind, sent),) = client.calls
    assert (run_id, kind) == ("ref-run", "logprobs")
    assert sent["sequences"][1]["token_ids"] == PROMPT + [12, 13, 14]
    for datum, sequence, advantage in zip(payload["data"], SEQUENCES, [0.5, -0.5], strict=True):
        n = len(sequence["tokens"])
        base = advantage / n if length_normalize else advantage
        expected = [base - 0.5 * (lp - (-1.0)) for lp in sequence["logprobs"]]
        assert values(datum, "advantages")[PAD:] == pytest.approx(expected)
    sampled = [lp for sequence in SEQUENCES for lp in sequence["logprobs"]]
    expected_kl = sum(lp + 1.0 for lp in sampled) / len(sampled)
    assert recipe.finish_cycle(0, ctx) == pytest.approx({"reference_kl": expected_kl})  # type: ignore[misc]


@pytest.mark.parametrize("loss", ["ppo_critic", "cross_entropy"])
def test_reference_kl_needs_per_token_advantages(loss: str) -> None:
    config = RLConfig(loss=loss, reference_kl=ReferenceKLSettings(enabled=True))
    with pytest.raises(ConfigError) as error:
        check_rl_config(config)
    assert error.value.field == "reference_kl"


@pytest.mark.parametrize("provider", ["modal", "tinker", "local"])
def test_reference_kl_passes_the_check_everywhere(provider: str) -> None:
    config = RLConfig(provider=provider, loss="ppo", reference_kl={"enabled": True})
    plan = check_rl_config(config)
    payload, client = probe(plan)
    assert [(run_id, kind) for run_id, kind, _ in client.calls] == [("probe-reference", "logprobs")]
    assert payload["loss_function"] == "ppo"


def test_loss_config_keys_are_checked_by_the_recipe() -> None:
    check_rl_config(
        RLConfig(provider="tinker", loss="ppo", loss_config={"clip_low_threshold": 0.7})
    )
    with pytest.raises(ConfigError) as error:
        check_rl_config(RLConfig(provider="local", loss="ppo", loss_config={"beta": 0.1}))
    assert error.value.field == "loss_config"
    assert "loss_config.beta" in error.value.message
    assert "clip_low_threshold, clip_high_threshold" in error.value.message
    with pytest.raises(ConfigError) as error:
        check_rl_config(
            RLConfig(
                loss="cispo", loss_config={"clip_low_threshold": 2.0, "clip_high_threshold": 1}
            )
        )
    assert error.value.field == "loss_config"
    with pytest.raises(ConfigError) as error:
        check_rl_config(RLConfig(loss="importance_sampling", loss_config={"beta": 0.1}))
    assert error.value.field == "loss_config"


def test_critic_recipe_check_probes_both_runs() -> None:
    plan = check_rl_config(RLConfig(provider="modal", loss="ppo_critic"))
    _, client = probe(plan)
    assert [(run_id, kind) for run_id, kind, _ in client.calls] == [
        ("probe-critic", "forward"),
        ("probe-critic", "forward_backward"),
        ("probe-critic", "optim_step"),
    ]


def test_a_critic_is_refused_where_the_provider_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert flowtest_recipe_helpers.PPO_WITH_CRITIC  # imported before the registry points at it
    monkeypatch.setitem(recipes.RECIPES, "ppo", "flowtest_recipe_helpers:PPO_WITH_CRITIC")
    with pytest.raises(ConfigError) as error:
        check_rl_config(RLConfig(provider="tinker", loss="ppo"))
    assert error.value.field == "loss"
    assert "critic" in error.value.message and "tinker" in error.value.message
    check_rl_config(RLConfig(provider="modal", loss="ppo"))


def test_a_recipe_sending_a_critic_a_bad_loss_config_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    critic = load_recipe("ppo_critic")

    def finish_cycle(cycle: int, ctx: LossContext) -> dict[str, float]:
        payload = {"data": [], "loss_function": "ppo_critic", "loss_config": {"beta": 1.0}}
        ctx.client.run_operation(ctx.runs["critic"].run_id, "forward_backward", payload)
        return {}

    broken = Recipe(
        name="broken",
        loss_function="ppo",
        build_loss=load_recipe("ppo").build_loss,
        auxiliary_runs=critic.auxiliary_runs,
        finish_cycle=finish_cycle,
    )
    monkeypatch.setitem(globals(), "BROKEN", broken)
    monkeypatch.setitem(recipes.RECIPES, "ppo", "test_recipes:BROKEN")
    with pytest.raises(ConfigError) as error:
        check_rl_config(RLConfig(provider="modal", loss="ppo"))
    assert error.value.field == "loss_config"
    assert "critic run" in error.value.message
