"""Base models `hf:<repo id or local dir>`: a Llama checkpoint from the local Hugging Face cache
(offline) or a directory, loaded through transformers into the plain-torch engine. Imported
lazily. Which directories a tenant may name is the service's decision (`serve --hf-dir`)."""

from __future__ import annotations

import torch
from torch import Tensor

from whitney.errors import UnsupportedBaseModel
from whitney.local.engine.model import ModelConfig, weight_shapes

MAX_POSITIONS = 4096  # a CPU engine's context: bounds the RoPE tables and KV caches


def unsupported(base_model: str, why: str) -> UnsupportedBaseModel:
    return UnsupportedBaseModel(
        f"unsupported base model {base_model!r}: {why}", details={"base_model": base_model}
    )


def local_source(base_model: str) -> str:
    """The directory to load an `hf:` base model from: an absolute path as given, a repo id's
    snapshot in the local Hugging Face cache (never a directory of that name elsewhere)."""
    source = base_model.removeprefix("hf:")
    if source.startswith("/"):
        return source
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise unsupported(base_model, "the optional `hf` extra (transformers) is missing") from None
    try:
        return snapshot_download(source, local_files_only=True)
    except Exception:  # huggingface_hub raises several types for a name it does not have
        raise unsupported(base_model, "not in the local Hugging Face cache") from None


def load(base_model: str) -> tuple[ModelConfig, dict[str, Tensor]]:
    """Config and float32 weights (HF Llama names, untied head) of a cached Llama model."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise unsupported(base_model, "the optional `hf` extra (transformers) is missing") from None
    repo = local_source(base_model)
    try:
        config = AutoConfig.from_pretrained(repo, local_files_only=True)
    except (OSError, ValueError):
        raise unsupported(base_model, "not in the local Hugging Face cache") from None
    rope = dict(
        getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    )
    if config.model_type != "llama" or rope.get("rope_type", "default") != "default":
        raise unsupported(base_model, "only Llama models with default RoPE are served")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise unsupported(base_model, "projection biases are not supported")
    model = AutoModelForCausalLM.from_pretrained(repo, local_files_only=True, dtype=torch.float32)
    state = dict(model.state_dict())
    if config.tie_word_embeddings or "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    eos = config.eos_token_id
    cfg = ModelConfig(
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        num_kv_heads=config.num_key_value_heads or 0,
        head_dim=getattr(config, "head_dim", None) or 0,
        max_positions=min(config.max_position_embeddings, MAX_POSITIONS),
        rms_eps=config.rms_norm_eps,
        rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
        eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
    )
    weights = {n: state[n].detach().float().contiguous().clone() for n in weight_shapes(cfg)}
    return cfg, weights
