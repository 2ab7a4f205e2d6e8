"""REINFORCE++'s reference KL end to end: a frozen reference run (`trainable: false`) answers
`logprobs` through ctx on every provider; with kl_coef > 0 the KL to it stays bounded, with
kl_coef = 0 it grows, on the same seeds; a cycle failing after the reference's answer
replays exactly."""

from __future__ import annotations

import statistics

import pytest
from flowtest_helpers import assert_executed_once_in_order
from flowtest_recipe_helpers import assert_replays_exactly, auxiliary_run_id, journaled

from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.recipes.reference_kl import ReferenceKLSettings
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


@pytest.mark.parametrize(
    ("loss", "provider"),
    [
        ("importance_sampling", "modal"),
        ("importance_sampling", "tinker"),
        ("importance_sampling", "local"),
        ("ppo", "tinker"),
    ],
)
def test_reference_answers_logprobs_on_every_provider(
    loss: str,
    provider: str,
    whitney: EmbeddedWhitney,
    inspector: WhitneyClient,
    small_config: RLConfig,
) -> None:
    config = small_config.model_copy(
        update={
            "loss": loss,
            "provider": provider,
            "reference_kl": ReferenceKLSettings(enabled=True, kl_coef=0.1),
        }
    )
    result = rl_flow(config)

    reference = auxiliary_run_id(inspector, result.session_id, result.run_id)
    run = inspector.get_run(reference)
    assert (run.trainable, run.role, run.status, run.step) == (False, "policy", "finished", 0)
    assert run.base_model == config.base_model and run.provider == provider
    rows = assert_executed_once_in_order(whitney, reference)
    assert [row["kind"] for row in rows] == ["save_weights_for_sampler"] + ["logprobs"] * (
        config.cycles * config.prompts_per_cycle
    )
    assert_executed_once_in_order(whitney, result.run_id)
    assert result.cycles[0].recipe_metrics["reference_kl"] == pytest.approx(0.0, abs=1e-4)
    for cycle in result.cycles:
        assert set(cycle.recipe_metrics) == {"reference_kl"}
    for op in journaled(whitney, result.run_id, "forward_backward"):
        inputs = op["payload"]["data"][0]["loss_inputs"]
        assert ("clip_low_threshold" in inputs) == (loss == "ppo")


def test_the_kl_stays_bounded_with_a_coefficient_and_grows_without(
    whitney: EmbeddedWhitney, small_config: RLConfig
) -> None:
    config = small_config.model_copy(update={"env": "lowercase", "cycles": 8})
    free, held = (
        rl_flow(
            config.model_copy(
                update={"reference_kl": ReferenceKLSettings(enabled=True, kl_coef=coef)}
            )
        )
        for coef in (0.0, 1.0)
    )
    free_kl = [cycle.recipe_metrics["reference_kl"] for cycle in free.cycles]
    held_kl = [cycle.recipe_metrics["reference_kl"] for cycle in held.cycles]
    print("reference KL, kl_coef 0:", [round(kl, 4) for kl in free_kl])
    print("reference KL, kl_coef 1:", [round(kl, 4) for kl in held_kl])
    assert free_kl[0] == pytest.approx(0.0, abs=1e-4) == held_kl[0]  # the same start
    # kl_coef = 0: the policy walks away from the reference as it learns
    assert statistics.fmean(free_kl[-2:]) > 0.5
    assert statistics.fmean(free_kl[-2:]) > 4 * statistics.fmean(free_kl[1:3])
    # kl_coef = 1: held near it the whole time
    assert max(held_kl) < 0.35
    assert statistics.fmean(held_kl[-2:]) < statistics.fmean(free_kl[-2:]) / 4


def test_a_cycle_failing_after_the_reference_answered_replays_exactly(
    whitney: EmbeddedWhitney,
    inspector: WhitneyClient,
    small_config: RLConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = small_config.model_copy(
        update={
            "reference_kl": ReferenceKLSettings(enabled=True, kl_coef=0.5, length_normalize=True)
        }
    )
    second_answer_in_cycle_1 = config.prompts_per_cycle + 2
    assert_replays_exactly(
        whitney,
        inspector,
        config,
        monkeypatch,
        lambda kind, _: kind == "logprobs",
        second_answer_in_cycle_1,
    )
