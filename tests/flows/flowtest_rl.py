"""A small RL config for the flow tests: learning is not the point of most of them."""

from __future__ import annotations

from flowtest_settings import QUICK_RECOVERY

from flows.rl.config import RLConfig


def small_rl_config(api_url: str) -> RLConfig:
    """A fast RL config on local/nano: learning is not the point of most tests."""
    return RLConfig(
        api_url=api_url,
        base_model="local/nano",
        cycles=3,
        prompts_per_cycle=3,
        group_size=4,
        max_tokens=8,
        seed=11,
        **QUICK_RECOVERY,
    )
