"""Which Hugging Face checkpoints the embedded server serves, from their config.json alone (no
torch, no transformers): Llama and Qwen2 decoders with default, linear or Llama 3 RoPE, no
projection biases on Llama, no sliding-window attention on Qwen2. `served_repo_ids` lists
those of the local Hugging Face cache, as the capabilities document names them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from whitney import hf_cache

ARCHITECTURES: tuple[str, ...] = ("llama", "qwen2")
ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")


def read_config(directory: Path) -> dict[str, Any] | None:
    """The checkpoint's config.json as a dict, or None if there is none to read."""
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return config if isinstance(config, dict) else None


def rope_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The RoPE settings however the config writes them: `rope_parameters` (transformers 5)
    or `rope_scaling` beside `rope_theta` (older checkpoints)."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope.setdefault("rope_type", rope.get("type", "default"))
    rope.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    return rope


def unsupported_reason(config: dict[str, Any] | None) -> str | None:
    """Why the engine cannot serve a checkpoint of this config, or None if it can."""
    if config is None:
        return "no readable config.json"
    architecture = config.get("model_type")
    if architecture not in ARCHITECTURES:
        return f"architecture {architecture!r} is not served (served: {', '.join(ARCHITECTURES)})"
    rope = rope_settings(config)
    if rope["rope_type"] not in ROPE_TYPES:
        return f"RoPE type {rope['rope_type']!r} is not served (served: {', '.join(ROPE_TYPES)})"
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        return "partial rotary embeddings are not supported"
    if architecture == "llama" and (config.get("attention_bias") or config.get("mlp_bias")):
        return "Llama projection biases are not supported"
    if architecture == "qwen2" and config.get("use_sliding_window"):
        return "sliding-window attention is not supported"
    return None


def has_weights(directory: Path) -> bool:
    """Whether the checkpoint holds weights (not only a tokenizer, as a client's cache may)."""
    return any(directory.glob("*.safetensors")) or any(directory.glob("pytorch_model*.bin"))


def served_repo_ids(cache: Path) -> list[str]:
    """The repo ids of the cache whose checkpoints the engine serves, sorted."""
    served = []
    for repo_id in hf_cache.cached_repo_ids(cache):
        snapshot = hf_cache.snapshot(repo_id, cache)
        if snapshot is None or not has_weights(snapshot):
            continue
        if unsupported_reason(read_config(snapshot)) is None:
            served.append(repo_id)
    return served
