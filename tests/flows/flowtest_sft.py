"""A small SFT config for the flow tests: learning is not the point of most of them."""

from __future__ import annotations

from typing import Any

from flowtest_settings import QUICK_RECOVERY

from flows.sft.config import SFTConfig


def small_sft_config(api_url: str, **updates: Any) -> SFTConfig:
    """3 cycles of 2 steps of 4 examples on local/nano, eval every 2 steps, a checkpoint after
    every cycle but the last."""
    settings: dict[str, Any] = {
        "api_url": api_url,
        "base_model": "local/nano",
        "steps": 6,
        "steps_per_cycle": 2,
        "batch_size": 4,
        "eval_every": 2,
        "warmup_steps": 1,
        "checkpoint_every": 1,
        "seed": 5,
        **QUICK_RECOVERY,
    }
    return SFTConfig(**(settings | updates))
