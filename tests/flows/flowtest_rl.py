"""A small RL config for the flow tests: learning is not the point of most of them."""

from __future__ import annotations

from typing import Any

from flowtest_settings import QUICK_RECOVERY

from flows.rl.config import RLConfig


def small_rl_config(api_url: str, **updates: Any) -> RLConfig:
    """3 cycles of 3 prompts x 4 samples x 8 tokens on local/nano, with `updates` on top."""
    settings: dict[str, Any] = {
        "api_url": api_url,
        "base_model": "local/nano",
        "cycles": 3,
        "prompts_per_cycle": 3,
        "group_size": 4,
        "max_tokens": 8,
        "seed": 11,
        **QUICK_RECOVERY,
    }
    return RLConfig(**(settings | updates))
