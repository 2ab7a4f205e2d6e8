"""A Llama-style decoder in plain torch (RMSNorm, RoPE, SwiGLU, causal SDPA attention, untied
head, no biases) over a flat dict of weights named as Hugging Face's LlamaForCausalLM names them."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from whitney.tokenizers import EOS_ID, VOCAB_SIZE

if TYPE_CHECKING:
    from whitney.local.engine.lora import Lora

BASE_INIT_SEED = 0
PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder; `head_dim` defaults to hidden_size // num_heads."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int = VOCAB_SIZE
    num_kv_heads: int = 0  # 0 = num_heads (no grouped-query attention)
    head_dim: int = 0
    max_positions: int = 1024
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    eos_token_ids: tuple[int, ...] = (EOS_ID,)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads


CONFIGS: dict[str, ModelConfig] = {
    "local/nano": ModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=512),
    "local/tiny": ModelConfig(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512),
    "local/small": ModelConfig(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
}


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in a fixed order."""
    h, d, i = cfg.hidden_size, cfg.dim_head, cfg.intermediate_size
    q, kv = cfg.num_heads * d, cfg.kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    return shapes | {"model.norm.weight": (h,), "lm_head.weight": (cfg.vocab_size, h)}


def init_weights(cfg: ModelConfig, seed: int = BASE_INIT_SEED) -> dict[str, Tensor]:
    """Random base weights: N(0, 0.02) matrices, N(0, hidden^-0.5) head, unit norms."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in weight_shapes(cfg).items():
        if len(shape) == 1:
            weights[name] = torch.ones(shape)
        else:
            std = cfg.hidden_size**-0.5 if name == "lm_head.weight" else 0.02
            weights[name] = torch.randn(shape, generator=gen) * std
    return weights


@functools.cache
def rope_tables(cfg: ModelConfig) -> tuple[Tensor, Tensor]:
    """cos and signed sin [max_positions, head_dim] for Hugging Face's rotate_half layout:
    x * cos + rotate_half(x) * sin == x * cos + roll(x, d/2) * cat(-sin, sin)."""
    d = cfg.dim_head
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.outer(torch.arange(cfg.max_positions).float(), inv_freq)
    return torch.cat((freqs, freqs), dim=-1).cos(), torch.cat((-freqs.sin(), freqs.sin()), dim=-1)


def rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class KVCache:
    """Pre-allocated keys and values of every layer for `batch` rows of up to `length` positions."""

    def __init__(self, cfg: ModelConfig, batch: int, length: int) -> None:
        shape = (cfg.num_layers, batch, cfg.kv_heads, length, cfg.dim_head)
        self.k = torch.empty(shape)
        self.v = torch.empty(shape)
        self.pos = 0  # positions filled so far


class Llama:
    """The decoder over a weight dict, optionally with a LoRA adapter applied unmerged."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, Tensor], lora: Lora | None = None):
        self.cfg, self.w, self.lora = cfg, weights, lora
        self.cos, self.sin = rope_tables(cfg)

    def linear(self, x: Tensor, name: str) -> Tensor:
        if self.lora is None:
            return F.linear(x, self.w[name + ".weight"])
        return self.lora.linear(x, self.w[name + ".weight"], name)

    def attention(self, x: Tensor, n: int, cache: KVCache | None) -> Tensor:
        B, T, _ = x.shape
        pos = 0 if cache is None else cache.pos
        cos, sin = self.cos[pos : pos + T, None], self.sin[pos : pos + T, None]
        q, k, v = (t.transpose(1, 2) for t in self.rotary_qkv(x, n, cos, sin))
        if cache is not None:
            cache.k[n, :, :, pos : pos + T] = k  # a batch of 1 (a shared prompt) fills every row
            cache.v[n, :, :, pos : pos + T] = v
            if pos > 0:
                assert T == 1, "after the prompt, decode one position at a time"
                k, v = cache.k[n, :, :, : pos + 1], cache.v[n, :, :, : pos + 1]
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=T > 1, enable_gqa=self.cfg.kv_heads != self.cfg.num_heads
        )
        return self.linear(
            y.transpose(1, 2).reshape(B, T, -1), f"model.layers.{n}.self_attn.o_proj"
        )

    def rotary_qkv(self, x: Tensor, n: int, cos: Tensor, sin: Tensor) -> tuple[Tensor, ...]:
        """Queries and keys with RoPE applied, and values: [B, T, heads, head_dim] each."""
        cfg, p = self.cfg, f"model.layers.{n}.self_attn."
        B, T, _ = x.shape
        q = self.linear(x, p + "q_proj").view(B, T, cfg.num_heads, cfg.dim_head)
        k = self.linear(x, p + "k_proj").view(B, T, cfg.kv_heads, cfg.dim_head)
        v = self.linear(x, p + "v_proj").view(B, T, cfg.kv_heads, cfg.dim_head)
        return rope(q, cos, sin), rope(k, cos, sin), v

    def norm(self, x: Tensor, name: str) -> Tensor:
        return rms_norm(x, self.w[name], self.cfg.rms_eps)

    def mlp(self, x: Tensor, n: int) -> Tensor:
        p = f"model.layers.{n}.mlp."
        gate, up = self.linear(x, p + "gate_proj"), self.linear(x, p + "up_proj")
        return self.linear(F.silu(gate) * up, p + "down_proj")

    def hidden(self, ids: Tensor, cache: KVCache | None = None) -> Tensor:
        """Final-norm hidden states [B, T, hidden] of token ids [B, T]; right padding is harmless
        (causal attention never looks ahead). With a cache, continues at cache.pos."""
        x = F.embedding(ids, self.w["model.embed_tokens.weight"])
        for n in range(self.cfg.num_layers):
            p = f"model.layers.{n}."
            x = x + self.attention(self.norm(x, p + "input_layernorm.weight"), n, cache)
            x = x + self.mlp(self.norm(x, p + "post_attention_layernorm.weight"), n)
        if cache is not None:
            cache.pos += ids.shape[1]
        return self.norm(x, "model.norm.weight")

    def logits(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.w["lm_head.weight"])


class FrozenLlama(Llama):
    """Inference on fixed weights (a sampler snapshot), arranged for small-batch CPU decoding:
    projections pre-transposed, q/k/v and gate/up fused, each RMSNorm weight folded into the
    projections it feeds, RoPE applied to queries and keys at once."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, Tensor]) -> None:
        super().__init__(cfg, weights)
        self.t: dict[str, Tensor] = {}
        for n in range(cfg.num_layers):
            p = f"model.layers.{n}."
            g_attn = weights[p + "input_layernorm.weight"]
            g_mlp = weights[p + "post_attention_layernorm.weight"]
            qkv = [weights[p + f"self_attn.{m}_proj.weight"] * g_attn for m in "qkv"]
            gate_up = [weights[p + f"mlp.{m}_proj.weight"] * g_mlp for m in ("gate", "up")]
            self.t[p + "qkv"] = torch.cat(qkv).t().contiguous()
            self.t[p + "gate_up"] = torch.cat(gate_up).t().contiguous()
            self.t[p + "self_attn.o_proj"] = weights[p + "self_attn.o_proj.weight"].t().contiguous()
            self.t[p + "mlp.down_proj"] = weights[p + "mlp.down_proj.weight"].t().contiguous()
        head = weights["lm_head.weight"] * weights["model.norm.weight"]
        self.t["lm_head"] = head.t().contiguous()
        self.w = {"model.embed_tokens.weight": weights["model.embed_tokens.weight"]}

    def norm(self, x: Tensor, name: str) -> Tensor:
        """RMSNorm without its weight (folded into the next projection); so `hidden` here is
        the final hidden state before the norm weight."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps)

    def linear(self, x: Tensor, name: str) -> Tensor:
        return x @ self.t[name]

    def rotary_qkv(self, x: Tensor, n: int, cos: Tensor, sin: Tensor) -> tuple[Tensor, ...]:
        h, kv = self.cfg.num_heads, self.cfg.kv_heads
        qkv = (x @ self.t[f"model.layers.{n}.qkv"]).view(*x.shape[:2], h + 2 * kv, -1)
        qk = rope(qkv[:, :, : h + kv], cos, sin)
        return qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kv :]

    def mlp(self, x: Tensor, n: int) -> Tensor:
        p = f"model.layers.{n}."
        gate, up = (x @ self.t[p + "gate_up"]).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ self.t[p + "mlp.down_proj"]

    def logits(self, hidden: Tensor) -> Tensor:
        return hidden @ self.t["lm_head"]
