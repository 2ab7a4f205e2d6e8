"""Hugging Face base models: a Llama or Qwen2 checkpoint (what `whitney.local.hf_models`
serves), loaded through transformers into the plain-torch engine, offline. Its directory is
an absolute path (`hf:<dir>`), or a repo id's snapshot in the server's Hugging Face cache
(`hf:<owner/name>` or a plain `owner/name`, as a provider names it). Imported lazily. Which
directories a tenant may name is the service's decision (`serve --hf-dir`)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from whitney import hf_cache
from whitney.errors import UnsupportedBaseModel
from whitney.local import hf_models
from whitney.local.engine.model import ModelConfig, weight_shapes

MAX_POSITIONS = 4096  # a CPU engine's context: bounds the RoPE tables and KV caches
HF_PREFIX = "hf:"


def unsupported(base_model: str, why: str) -> UnsupportedBaseModel:
    return UnsupportedBaseModel(
        f"unsupported base model {base_model!r}: {why}", details={"base_model": base_model}
    )


def is_hf_name(base_model: str) -> bool:
    """Whether the name is one this backend resolves: `hf:...` or a plain repo id."""
    return base_model.startswith(HF_PREFIX) or hf_cache.is_repo_id(base_model)


def source_directory(base_model: str, cache: Path | None) -> Path:
    """The directory to load a base model from: an absolute path as given, a repo id's
    snapshot in the Hugging Face cache (never a directory of that name elsewhere)."""
    source = base_model.removeprefix(HF_PREFIX)
    if source.startswith("/"):
        return Path(source)
    found = hf_cache.snapshot(source, cache)
    if found is None:
        raise unsupported(base_model, "not in the local Hugging Face cache")
    return found


def model_config(config: dict, vocab_size: int) -> ModelConfig:
    """The engine's ModelConfig of a served checkpoint's config.json."""
    rope = hf_models.rope_settings(config)
    heads = config["num_attention_heads"]
    eos = config.get("eos_token_id")
    return ModelConfig(
        hidden_size=config["hidden_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        intermediate_size=config["intermediate_size"],
        vocab_size=vocab_size,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        max_positions=min(config.get("max_position_embeddings", MAX_POSITIONS), MAX_POSITIONS),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope["rope_theta"]),
        eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
        architecture=config["model_type"],
        attention_bias=config["model_type"] == "qwen2",
        rope_type=rope["rope_type"],
        rope_factor=float(rope.get("factor", 1.0)),
        rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
        rope_original_max_positions=int(rope.get("original_max_position_embeddings", 0)),
    )


def load(base_model: str, directory: Path) -> tuple[ModelConfig, dict[str, Tensor]]:
    """Config and float32 weights (HF names, untied head) of the checkpoint in `directory`."""
    config = hf_models.read_config(directory)
    why = hf_models.unsupported_reason(config)
    if config is None or why is not None:
        raise unsupported(base_model, why or "no readable config.json")
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise unsupported(base_model, "the optional `hf` extra (transformers) is missing") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(
            directory, local_files_only=True, dtype=torch.float32
        )
    except (OSError, ValueError):
        raise unsupported(base_model, "its weights cannot be read") from None
    state = dict(model.state_dict())
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])  # tied: a copy
    cfg = model_config(config, state["model.embed_tokens.weight"].shape[0])
    return cfg, {n: state[n].detach().float().contiguous().clone() for n in weight_shapes(cfg)}
