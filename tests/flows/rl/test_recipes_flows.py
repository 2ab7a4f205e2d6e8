"""Every recipe end to end: 3 cycles on each provider that serves it (per the page's table),
refused before any session opens on each that does not."""

from __future__ import annotations

import pytest
from flowtest_helpers import assert_executed_once_in_order, assert_finished, flow_run_sessions
from flowtest_recipe_helpers import REFUSED, SERVED, journaled

from flows.core.config import ConfigError
from flows.rl import recipes
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.plan import check_rl_config
from flows.rl.recipes import load_recipe
from flows.rl.recipes.reference_kl import ReferenceKLSettings
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

CLIPPED = {"ppo", "cispo", "gspo", "ppo_critic"}


@pytest.mark.parametrize(("loss", "provider"), SERVED)
def test_recipe_runs_three_cycles(
    loss: str,
    provider: str,
    whitney: EmbeddedWhitney,
    inspector: WhitneyClient,
    small_config: RLConfig,
) -> None:
    config = small_config.model_copy(update={"loss": loss, "provider": provider})
    result = rl_flow(config)

    assert [cycle.cycle for cycle in result.cycles] == [0, 1, 2]
    policy = assert_executed_once_in_order(whitney, result.run_id)
    backward = journaled(whitney, result.run_id, "forward_backward")
    assert len(backward) == 3
    recipe = load_recipe(loss)
    for op in backward:
        payload = op["payload"]
        assert payload["loss_function"] == recipe.loss_function
        inputs = payload["data"][0]["loss_inputs"]
        if loss in CLIPPED and provider == "tinker":
            assert {"clip_low_threshold", "clip_high_threshold"} <= set(inputs)
            assert payload["loss_config"] == {}
        elif loss in CLIPPED:
            assert "clip_low_threshold" not in inputs
            assert set(payload["loss_config"]) >= {"clip_low_threshold", "clip_high_threshold"}
    runs = assert_finished(inspector, result.session_id)
    assert len(runs) == 1 + len(recipe.auxiliary_runs)
    for run in runs:
        if run.run_id != result.run_id:
            assert_executed_once_in_order(whitney, run.run_id)
    assert policy[-1]["kind"] == "export_lora"
    assert all(cycle.loss == cycle.loss for cycle in result.cycles)  # not NaN


@pytest.mark.parametrize(("loss", "provider"), REFUSED)
def test_recipe_is_refused_before_any_session(
    loss: str, provider: str, inspector: WhitneyClient, small_config: RLConfig
) -> None:
    config = small_config.model_copy(update={"loss": loss, "provider": provider})
    with pytest.raises(ConfigError) as error:
        check_rl_config(config)
    assert error.value.field == "loss"
    assert_refused_before_any_session(inspector, config)


def assert_refused_before_any_session(inspector: WhitneyClient, config: RLConfig) -> None:
    sessions_before = len(inspector.list_sessions())
    state = rl_flow(config, return_state=True)
    assert state.is_failed()
    assert "ConfigError" in (state.message or "")
    assert flow_run_sessions(inspector, state.state_details.flow_run_id) == []
    assert len(inspector.list_sessions()) == sessions_before


def test_a_recipe_needing_a_critic_is_refused_on_tinker(
    inspector: WhitneyClient, small_config: RLConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(recipes.RECIPES, "ppo", "flowtest_recipe_helpers:PPO_WITH_CRITIC")
    config = small_config.model_copy(update={"loss": "ppo", "provider": "tinker"})
    with pytest.raises(ConfigError, match="needs a critic run"):
        check_rl_config(config)
    assert_refused_before_any_session(inspector, config)


@pytest.mark.parametrize(
    ("update", "field"),
    [
        ({"loss": "ppo", "provider": "modal", "loss_config": {"beta": 0.1}}, "loss_config"),
        ({"loss": "dppo", "provider": "modal", "loss_config": {"delta_low": 2.0}}, "loss_config"),
        (
            {"loss": "ppo_critic", "reference_kl": ReferenceKLSettings(enabled=True)},
            "reference_kl",
        ),
    ],
)
def test_bad_recipe_settings_are_refused_before_any_session(
    update: dict, field: str, inspector: WhitneyClient, small_config: RLConfig
) -> None:
    config = small_config.model_copy(update=update)
    with pytest.raises(ConfigError) as error:
        check_rl_config(config)
    assert error.value.field == field
    assert_refused_before_any_session(inspector, config)
