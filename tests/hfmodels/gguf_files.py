"""Tiny GGUF files written offline with the `gguf` package's writer, as llama.cpp's
convert_hf_to_gguf.py writes a Hugging Face checkpoint: a random 2-layer Llama (grouped-query
attention, tied embeddings; q and k rows permuted as llama.cpp does) and Qwen2 (q/k/v biases),
with their byte-level BPE tokenizers and chat templates in the metadata; and files an import
must refuse (another architecture, a truncated file, a file that is not GGUF)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.hfmodels.builders import llama3_tokenizer, perturb, qwen_tokenizer

LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
"""A decoder layer's tensor names, Hugging Face's -> GGUF's (blk.N.*)."""


def tiny_model(architecture: str) -> tuple[Any, Any]:
    """A random 2-layer Llama or Qwen2 (tied embeddings, 4 query heads on 2 KV heads) and its
    tokenizer (tests.hfmodels.builders)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    llama = architecture == "llama"
    tokenizer = llama3_tokenizer() if llama else qwen_tokenizer()
    config_class, model_class = (
        (LlamaConfig, LlamaForCausalLM) if llama else (Qwen2Config, Qwen2ForCausalLM)
    )
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=10000.0 if llama else 1000000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(3)
    model = model_class(config)
    perturb(model, 3)
    return model.eval(), tokenizer


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's reordering of a Llama q or k projection's rows (rotary halves interleaved)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_tensors(model: Any, architecture: str) -> dict[str, np.ndarray]:
    """The model's weights under GGUF names, as float32 arrays."""
    config = model.config
    tensors = {}
    for name, tensor in model.state_dict().items():
        array = tensor.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            tensors["token_embd.weight"] = array
        elif name == "model.norm.weight":
            tensors["output_norm.weight"] = array
        elif name.startswith("model.layers."):
            layer, _, rest = name.removeprefix("model.layers.").partition(".")
            if architecture == "llama" and rest == "self_attn.q_proj.weight":
                array = permute(array, config.num_attention_heads)
            elif architecture == "llama" and rest == "self_attn.k_proj.weight":
                array = permute(array, config.num_key_value_heads)
            tensors[f"blk.{layer}.{LAYER_TENSORS[rest]}"] = array
    return tensors


def write_gguf(
    path: Path, model: Any, tokenizer: Any, architecture: str, quantize: str | None = None
) -> Path:
    """`model` as a GGUF file at `path`: metadata, tokenizer and tensors; 2-D weights
    quantised to `quantize` (a GGML type name, e.g. Q8_0) if given, the rest float32."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_name(f"tiny {architecture}")
    writer.add_license("apache-2.0")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    qtype = gguf.GGMLQuantizationType[quantize] if quantize else None
    file_type = gguf.LlamaFileType[f"MOSTLY_{quantize}"] if quantize else gguf.LlamaFileType.ALL_F32
    writer.add_file_type(file_type)
    add_tokenizer(writer, tokenizer, architecture)
    for name, array in gguf_tensors(model, architecture).items():
        if qtype is not None and array.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_tokenizer(writer: Any, tokenizer: Any, architecture: str) -> None:
    """The tokenizer as llama.cpp stores a byte-level BPE: tokens, types, merges, special ids,
    chat template."""
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = {**backend["model"]["vocab"]}
    for added in backend["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = set(tokenizer.all_special_tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in backend["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe" if architecture == "llama" else "qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in special else 1 for token in tokens])
    writer.add_token_merges(merges)
    if tokenizer.bos_token_id is not None:
        writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_chat_template(tokenizer.chat_template)


def write_other_architecture(path: Path) -> Path:
    """A small, valid GGUF of an architecture the server does not serve (gpt2)."""
    import gguf

    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def truncated_copy(source: Path, path: Path) -> Path:
    """`source` cut in the middle of its tensor data."""
    path.write_bytes(source.read_bytes()[: source.stat().st_size * 2 // 3])
    return path
