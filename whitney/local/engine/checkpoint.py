"""Checkpoints (a directory of safetensors + json, base weights included) and the PEFT export
(one deterministic tar: same weights, same bytes)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save, save_file
from torch import Tensor

from whitney.local.engine.lora import Lora
from whitney.local.engine.model import PROJECTIONS, ModelConfig
from whitney.local.files import archive

FORMAT_VERSION = 1
BASE_FILE, ADAPTER_FILE, OPTIMIZER_FILE, STATE_FILE = (
    "base_model.safetensors",
    "adapter.safetensors",
    "optimizer.safetensors",
    "state.json",
)


@dataclass
class Checkpoint:
    """What a checkpoint directory holds. `meta`: base_model, model_config, lora_rank, lora_alpha,
    role, step, optimizer_t."""

    meta: dict
    base_weights: dict[str, Tensor]
    adapter: dict[str, Tensor]
    optimizer: dict[str, Tensor]

    @property
    def config(self) -> ModelConfig:
        fields = dict(self.meta["model_config"])
        fields["eos_token_ids"] = tuple(fields["eos_token_ids"])
        return ModelConfig(**fields)


def save_state(directory: Path, checkpoint: Checkpoint) -> None:
    """Write a checkpoint directory (created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file(checkpoint.base_weights, directory / BASE_FILE)
    save_file(checkpoint.adapter, directory / ADAPTER_FILE)
    save_file(checkpoint.optimizer, directory / OPTIMIZER_FILE)
    meta = checkpoint.meta | {"format": FORMAT_VERSION}
    (directory / STATE_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))


def load_state(directory: Path) -> Checkpoint:
    """Read a checkpoint directory written by save_state."""
    meta = json.loads((directory / STATE_FILE).read_text())
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"checkpoint format {meta.get('format')!r} is not {FORMAT_VERSION}")
    return Checkpoint(
        meta=meta,
        base_weights=load_file(directory / BASE_FILE),
        adapter=load_file(directory / ADAPTER_FILE),
        optimizer=load_file(directory / OPTIMIZER_FILE),
    )


def save_sampler(path: Path, snapshot: Lora) -> None:
    """A sampler's adapter snapshot as one safetensors file, written atomically."""
    tensors = {name: tensor.contiguous() for name, tensor in snapshot.parameters().items()}
    meta = {"rank": str(snapshot.rank), "alpha": repr(snapshot.alpha)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, tmp, metadata=meta)
    os.replace(tmp, path)


def load_sampler(path: Path) -> Lora:
    """The snapshot `save_sampler` wrote."""
    with safe_open(path, framework="pt") as handle:
        meta = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    names = [name.removesuffix(".lora_A") for name in tensors if name.endswith(".lora_A")]
    A = {name: tensors[name + ".lora_A"] for name in names}
    B = {name: tensors[name + ".lora_B"] for name in names}
    return Lora(A, B, int(meta["rank"]), float(meta["alpha"]))


def hf_config(cfg: ModelConfig) -> dict:
    """A transformers config.json that makes LlamaForCausalLM (or Qwen2ForCausalLM, for a
    Qwen2 base) load the base weights."""
    config = {
        "architectures": [
            "Qwen2ForCausalLM" if cfg.architecture == "qwen2" else "LlamaForCausalLM"
        ],
        "model_type": cfg.architecture,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.dim_head,
        "max_position_embeddings": cfg.max_positions,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "eos_token_id": list(cfg.eos_token_ids),
        "torch_dtype": "float32",
    }
    if cfg.architecture == "qwen2":
        config["use_sliding_window"] = False
    else:
        config |= {"attention_bias": False, "mlp_bias": False}
    if cfg.rope_type != "default":
        config["rope_scaling"] = {"rope_type": cfg.rope_type, "factor": cfg.rope_factor}
        if cfg.rope_type == "llama3":
            config["rope_scaling"] |= {
                "low_freq_factor": cfg.rope_low_freq_factor,
                "high_freq_factor": cfg.rope_high_freq_factor,
                "original_max_position_embeddings": cfg.rope_original_max_positions,
            }
    return config


def peft_files(base_model: str, lora: Lora) -> dict[str, bytes]:
    """adapter_config.json and adapter_model.safetensors in PEFT's layout."""
    config = {
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": lora.alpha,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": lora.rank,
        "target_modules": sorted(p.split(".")[-1] for p in PROJECTIONS),
        "task_type": "CAUSAL_LM",
        "use_rslora": False,
    }
    tensors = {}
    for name in lora.A:
        tensors[f"base_model.model.{name}.lora_A.weight"] = lora.A[name].detach().contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = lora.B[name].detach().contiguous()
    return {
        "adapter_config.json": canonical_json(config),
        "adapter_model.safetensors": save(tensors, metadata={"format": "pt"}),
    }


def export_lora(
    path: Path,
    *,
    base_model: str,
    cfg: ModelConfig,
    base_weights: dict[str, Tensor],
    lora: Lora,
    extra: dict[str, Tensor] | None = None,
) -> tuple[str, int]:
    """Write the PEFT adapter (top level), the base weights as a transformers model directory
    (base_model/) and, for a critic, value_head.safetensors, as one tar (sorted, mtime 0);
    returns (sha256, bytes)."""
    files = peft_files(base_model, lora) | {
        "base_model/config.json": canonical_json(hf_config(cfg)),
        "base_model/model.safetensors": save(base_weights, metadata={"format": "pt"}),
    }
    if extra:
        files["value_head.safetensors"] = save(extra, metadata={"format": "pt"})
    data = archive(files)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest(), len(data)


def canonical_json(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
