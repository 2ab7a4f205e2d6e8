"""A flow's plan is built once per process (flows.core.loop.plans): the CLI's check, the flow's and
every cycle's share it; a config that differs only in where the run goes and writes shares it
too, holding its own config; any other field builds a new plan; a refused config keeps
nothing."""

from __future__ import annotations

import pytest

from flows.core.config import ConfigError
from flows.rl import plan as rl_plan
from flows.rl.config import RLConfig
from flows.rl.plan import check_rl_config


def test_a_plan_is_built_once_per_config(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[RLConfig] = []
    load = rl_plan.load_rl_plan

    def counting_load(config: RLConfig) -> rl_plan.RLPlan:
        built.append(config)
        return load(config)

    monkeypatch.setattr(rl_plan, "load_rl_plan", counting_load)
    config = RLConfig(cycles=3)
    first = check_rl_config(config)
    assert check_rl_config(RLConfig(cycles=3)) is first
    wired = config.model_copy(update={"api_url": "http://127.0.0.1:1", "metrics_path": "m.jsonl"})
    shared = check_rl_config(wired)
    assert shared.config == wired and shared.recipe is first.recipe
    assert shared.renderer is first.renderer and shared.environment is first.environment
    assert len(built) == 1

    other = check_rl_config(RLConfig(cycles=4))
    assert other.config.cycles == 4 and other.renderer is not first.renderer
    assert len(built) == 2


def test_a_refused_config_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[RLConfig] = []
    load = rl_plan.load_rl_plan

    def refusing_once(config: RLConfig) -> rl_plan.RLPlan:
        calls.append(config)
        if len(calls) == 1:
            raise ConfigError("env", "refused once")
        return load(config)

    monkeypatch.setattr(rl_plan, "load_rl_plan", refusing_once)
    config = RLConfig(cycles=5)
    with pytest.raises(ConfigError):
        check_rl_config(config)
    assert check_rl_config(config).config == config and len(calls) == 2
