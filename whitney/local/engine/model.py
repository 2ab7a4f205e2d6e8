"""A Llama-style decoder in plain torch (RMSNorm, RoPE, SwiGLU, causal attention, untied head;
q/k/v biases for Qwen2) over a flat dict of weights named as Hugging Face's LlamaForCausalLM
and Qwen2ForCausalLM name them.

Its numbers are batch-invariant by construction (see `exact`): a token's hidden state depends
only on the weights and the tokens before it, never on batch-mates, padding, chunking or
whether it is decoded one step at a time from a cache or computed in a full forward. Training
(`trainable` LoRA) and sampling (`frozen` merged weights) run this one code path."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

from whitney.local.engine import exact, kernels, products
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
GROUPS = {  # projections that read the same input run as one matmul (bitwise the same result)
    "qkv": PROJECTIONS[:3],
    "o": PROJECTIONS[3:4],
    "gate_up": PROJECTIONS[4:6],
    "down": PROJECTIONS[6:],
}
VALUE_BITS = 21  # per part of a value on its static grid; see `value_grid`
ATTENTION_CHUNK = 1 << 22  # scores per chunk of queries in `Attention` (elements, at least a row)
CAUSAL_ROWS = 64  # queries per chunk of `Attention` below which it does not split for causality
LOGITS_CHUNK = 1 << 22  # logits per chunk of rows of `TargetLogprobs`' log-softmax (at least a row)
BLAS_ROWS = 8  # the head's product runs faster on a multiple of 8 rows (MKL: 85 rows ~10% slower)
SAVED_LOGITS = 1 << 26  # logits per block of `TargetLogprobs`; the backward keeps one block's
Check = Callable[[], None]  # called between stages of the work; raises to stop it


def no_check() -> None:
    """The `Check` of work nothing can stop."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder; `head_dim` defaults to hidden_size // num_heads. `architecture` is
    the transformers model type an export writes (`llama`, or `qwen2`: q/k/v biases);
    `rope_type` `linear` divides RoPE's frequencies by `rope_factor`, `llama3` rescales them
    as Llama 3.1 does (transformers' `_compute_llama3_parameters`)."""

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
    architecture: str = "llama"
    attention_bias: bool = False
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 0

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def prob_bits(self) -> int:
        """Bits per part of an attention weight: a sum over max_positions keys of weight times
        value stays below 2**53."""
        return exact.MANTISSA_BITS - 1 - VALUE_BITS - math.ceil(math.log2(self.max_positions))


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
            **attention_biases(cfg, p, q, kv),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    return shapes | {"model.norm.weight": (h,), "lm_head.weight": (cfg.vocab_size, h)}


def attention_biases(cfg: ModelConfig, prefix: str, q: int, kv: int) -> dict[str, tuple[int]]:
    """The q/k/v bias shapes of a layer, if the architecture has them."""
    if not cfg.attention_bias:
        return {}
    return {
        prefix + "self_attn.q_proj.bias": (q,),
        prefix + "self_attn.k_proj.bias": (kv,),
        prefix + "self_attn.v_proj.bias": (kv,),
    }


def init_weights(cfg: ModelConfig, seed: int = BASE_INIT_SEED) -> dict[str, Tensor]:
    """Random base weights: N(0, 0.02) matrices, N(0, hidden^-0.5) head, unit norms."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith(".bias"):
            weights[name] = torch.zeros(shape)
        elif len(shape) == 1:
            weights[name] = torch.ones(shape)
        else:
            std = cfg.hidden_size**-0.5 if name == "lm_head.weight" else 0.02
            weights[name] = torch.randn(shape, generator=gen) * std
    return weights


def inverse_frequencies(cfg: ModelConfig) -> Tensor:
    """RoPE's inverse frequencies [head_dim / 2] by transformers' float32 arithmetic per rope
    type (its divisions, products and comparisons are IEEE's, the same bits on every CPU), its
    pow theta ** (k / d) the engine's own: exp(y ln theta) in float64 (`exact.exp`, `exact.log`,
    theta as float32 as transformers' pow takes it), within about 2**-48 of the power, rounded
    once to float32: the correctly rounded float32 power but where the power lies that close to
    a point halfway between two float32s (double rounding)."""
    d = cfg.dim_head
    exponents = torch.arange(0, d, 2, dtype=torch.int64).float() / d
    log_theta = exact.log(torch.tensor(cfg.rope_theta, dtype=torch.float32).double())
    inv_freq = 1.0 / exact.exp(exponents.double() * log_theta).float()
    if cfg.rope_type == "linear":
        return inv_freq / cfg.rope_factor
    if cfg.rope_type != "llama3":
        return inv_freq
    factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    context = cfg.rope_original_max_positions
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < context / high) * ~(wavelen > context / low)
    return torch.where(medium, smoothed, scaled)


@functools.cache
def rope_tables(cfg: ModelConfig) -> tuple[Tensor, Tensor]:
    """cos and signed sin [max_positions, head_dim] for Hugging Face's rotate_half layout:
    x * cos + rotate_half(x) * sin == x * cos + roll(x, d/2) * cat(-sin, sin). The angles are
    transformers' float32 products position * inverse frequency (correctly rounded); their cos
    and sin the engine's own (`exact.cos`, `exact.sin`, within 1 ulp of float64), rounded once
    to float32: the correctly rounded float32 but where the value lies within a float64 ulp of a
    point halfway between two float32s (double rounding). The same bits on every CPU."""
    angles = torch.outer(torch.arange(cfg.max_positions).float(), inverse_frequencies(cfg))
    cos, sin = exact.cos(angles.double()).float(), exact.sin(angles.double()).float()
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """x * cos + x.roll(d / 2) * signed_sin, the roll as two slices: the same copies, which a
    compiled kernel makes in vector code (a compiled roll gathers element by element)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., -half:], x[..., :-half]), -1) * signed_sin


def rotated(heads: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """`rope` at cos and signed sin [B, T, 1, 1, d] of the queries and keys of float32 heads
    [B, T, groups + 2, kv_heads, d] (the query heads sharing each key-value head, the keys, the
    values): [B, T, groups + 1, kv_heads, d]."""
    return rope(heads[:, :, :-1], cos, signed_sin)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight * x / sqrt(mean(x**2) + eps), the mean exact, the root correctly rounded
    (`exact.square_root`); the gradient is RMSNorm's own (`RMSNorm`)."""
    if weight.requires_grad:
        raise NotImplementedError("rms_norm's weight is constant: only LoRA's adapters train")
    if x.requires_grad and torch.is_grad_enabled():
        return RMSNorm.apply(x, x, weight, eps)
    return scaled(x, exact.square_root(exact.mean_square(x) + eps), weight)


class RMSNorm(torch.autograd.Function):
    """`rms_norm` of x, given twice, with the bits of the gradient autograd takes of weight *
    (x / root), root = sqrt(m + eps), m the exact mean square with the float one's gradient
    (x.pow(2).mean(-1)): autograd's operations in its order, without its graph. The two parts,
    the quotient's and the mean square's, are the two x's gradients, so autograd adds them to
    x's others (a residual's, which comes first) one after the other, in that graph's order.
    The weight is constant (only LoRA's adapters train)."""

    @staticmethod
    def forward(ctx, x: Tensor, again: Tensor, weight: Tensor, eps: float) -> Tensor:
        root = exact.square_root(exact.mean_square(x) + eps)
        ctx.save_for_backward(x, weight, root)
        return scaled(x, root, weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, root = ctx.saved_tensors
        rows, roots = rows_and_roots(x, root)
        grad_quotient, terms = NORM_GRADIENT_PARTS(exact.rows(grad), weight, rows, roots)
        grad_root = terms.sum(-1, keepdim=True)
        grad_mean = grad_root / (2 * roots) / x.shape[-1]
        return (
            grad_quotient.view(x.shape),
            NORM_MEAN_GRADIENT(rows, grad_mean).view(x.shape),
            None,
            None,
        )


def scaled(x: Tensor, root: Tensor, weight: Tensor) -> Tensor:
    """weight * (x / root) of float32 x [..., K] and its roots [..., 1]: one kernel over rows."""
    return NORM_SCALED(*rows_and_roots(x, root), weight).view(x.shape)


def rows_and_roots(x: Tensor, root: Tensor) -> tuple[Tensor, Tensor]:
    """The rows [N, K] (float32) of x [..., K] and their roots [N, 1] of root [..., 1], as views."""
    return exact.rows(x), root.view(-1, 1)


def norm_scaled(x: Tensor, root: Tensor, weight: Tensor) -> Tensor:
    """weight * (x / root) of float32 rows [N, K], their roots [N, 1] and the norm's weight [K]."""
    return weight * (x / root)


def norm_gradient_parts(
    grad: Tensor, weight: Tensor, x: Tensor, root: Tensor
) -> tuple[Tensor, Tensor]:
    """`RMSNorm`'s gradient through the quotient, (grad * weight) / root, and the terms whose row
    sums are the root's, (x / root / root) * -(grad * weight): autograd's operations in its order,
    for float32 rows [N, K], the norm's weight [K] and the roots [N, 1]."""
    grad_normed = grad * weight
    return grad_normed / root, ((x / root) / root) * -grad_normed


def norm_mean_gradient(x: Tensor, grad_mean: Tensor) -> Tensor:
    """`RMSNorm`'s gradient through the mean square, (x * 2) * grad_mean, for float32 rows [N, K]
    and the mean square's gradient [N, 1]."""
    return (x * 2.0) * grad_mean


def norm_root(x: Tensor, eps: Tensor, unit: Tensor) -> Tensor:
    """RMSNorm's root of float32 rows [N, K] (no gradient), [N, 1]: `rms_norm`'s, eps float32,
    unit = 2**bits_for(K)."""
    return exact.sqrt_float32(exact.mean_square_rows(x, unit) + eps)


def residual_norm_root(
    x: Tensor, delta: Tensor, eps: Tensor, unit: Tensor
) -> tuple[Tensor, Tensor]:
    """x + delta (float32 rows [N, K]) and its `norm_root`."""
    total = x + delta
    return total, norm_root(total, eps, unit)


def scaled_grid(x: Tensor, weight: Tensor, root: Tensor, room: Tensor) -> Tensor:
    """weight * (x / root) for float32 rows [N, K] and their roots [N, 1] on its activation rows
    for a product (`exact.activation_grid`, room = 52 - weight bits), float64."""
    return exact.activation_grid(weight * (x / root), room)


@functools.cache
def epsilon(eps: float) -> Tensor:
    """eps as a float32 0-dim tensor, a kernel's argument (never an inference tensor): `rms_norm`
    adds eps rounded to float32, as torch adds a Python float to a float32 tensor."""
    with torch.inference_mode(False):
        return torch.tensor(eps, dtype=torch.float32)


def norm_rows(
    x: Tensor, weight: Tensor, eps: float, delta: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """x (plus `delta`, if given) [..., K] float32 and its `rms_norm` on the activation rows of
    a product with weights of `exact.weight_bits(K)` (no gradient): two fused kernels, the
    rows' roots and then the scaling with its rounding; the same bits."""
    k = x.shape[-1]
    unit = exact.power(exact.bits_for(k))
    if delta is None:
        total = exact.rows(x)
        root = NORM_ROOT(total, epsilon(eps), unit)
    else:
        total, root = RESIDUAL_NORM_ROOT(exact.rows(x), exact.rows(delta), epsilon(eps), unit)
    grid = SCALED_GRID(total, weight, root, exact.room(exact.weight_bits(k)))
    return total.view(x.shape), grid.view(x.shape)


def silu(x: Tensor) -> Tensor:
    return exact.vectorized(torch.ops.aten.silu, x)


def gate_silu(gate_up: Tensor) -> Tensor:
    """`silu` of the gate half of the gate and up projections side by side [..., 2 I] (no
    gradient), the half's rows read in place (`exact.vectorized`)."""
    i = gate_up.shape[-1] // 2
    return silu(gate_up.view(-1, 2 * i)[:, :i]).view(*gate_up.shape[:-1], i)


def gated_grid(activated: Tensor, gate_up: Tensor, room: Tensor) -> Tensor:
    """`exact.activation_grid` of activated * up for float32 rows [N, I] and the rows of the
    gate and up projections side by side [N, 2, I] (up the second), float64."""
    return exact.activation_grid(activated * gate_up[:, 1], room)


def gated_rows(activated: Tensor, gate_up: Tensor) -> Tensor:
    """`exact.activation_rows` of activated * up for the down projection (no gradient), for
    silu(gate) [..., I] and the gate and up projections side by side [..., 2 I]: one fused
    kernel, the same bits."""
    i = activated.shape[-1]
    both = exact.rows(gate_up).view(-1, 2, i)
    room = exact.room(exact.weight_bits(i))
    return GATED_GRID(exact.rows(activated), both, room).view(activated.shape)


def value_grid(
    w_v: Tensor, norm_weight: Tensor, cfg: ModelConfig, bias: Tensor | None = None
) -> Tensor:
    """Per value channel, a power of two above any value it can take: |v_c| <= sqrt(hidden) *
    sum_i |W_v[c, i] * g_i| + |b_c| for v = W_v RMSNorm(x) + b (|x_i| / rms(x) <=
    sqrt(hidden)), times 2 for rounding. Values are held on this grid (weights-only, so the same
    for every token) with 2 x VALUE_BITS bits; shape [kv_heads, 1, head_dim]."""
    bound = (w_v.detach().abs() @ norm_weight.detach().abs()).double() * math.sqrt(cfg.hidden_size)
    if bias is not None:
        bound = bound + bias.detach().abs().double()
    _, exponent = torch.frexp(bound * 2 + 1e-30)
    return exact.pow2(exponent - VALUE_BITS).view(cfg.kv_heads, 1, cfg.dim_head)


@dataclass(frozen=True)
class KeyValues:
    """A layer's keys and values side by side in one tensor [B, kv_heads, T, 3 d] (float64, or
    float32 in a `KVCache`: the same numbers), so a cache takes them in one write and the
    value's two parts meet a weight in one product: the keys on their fixed-point rows, then
    each value as hi + lo, hi on the static grid and lo on the grid 2**-VALUE_BITS finer."""

    data: Tensor

    @classmethod
    def of(cls, k: Tensor, v: Tensor, grid: Tensor) -> KeyValues:
        """Of float32 keys and values [B, kv_heads, T, d], the values' grid [kv_heads, 1, d]."""
        unit = exact.power(exact.bits_for(k.shape[-1]))
        key, value = (t.detach().float().contiguous() for t in (k, v))
        return cls(KEY_VALUES(key, value, unit, grid))

    @property
    def keys(self) -> Tensor:
        return self.data[..., : self.data.shape[-1] // 3]

    @property
    def values(self) -> Tensor:
        """hi and lo side by side [B, kv_heads, T, 2 d]."""
        return self.data[..., self.data.shape[-1] // 3 :]

    def upto(self, length: int) -> KeyValues:
        """The first `length` positions (these keys and values themselves if they are all)."""
        return self if length == self.data.shape[2] else KeyValues(self.data[:, :, :length])


def attention_weights_times_values(
    p: Tensor, stored: KeyValues, prob_bits: int, check: Check = no_check
) -> tuple[Tensor, Tensor]:
    """sum_j p_j v_j / sum_j p_j for p in [0, 1] (float32) [B, H, Tq, Tk], from exact sums (p
    split in hi + lo parts of prob_bits each, on grids common to all keys) combined in a fixed
    order; and sum_j p_j itself (exact, float64)."""
    p_hi, p_lo, z = PROB_PARTS(p.reshape(-1, p.shape[-1]), exact.power(prob_bits, torch.float64))
    check()
    kv, d = stored.data.shape[1], stored.data.shape[-1] // 3
    shape = (p.shape[0], kv, -1, p.shape[-1])  # `grouped`'s, of the rows [B * H * Tq, Tk]
    p_hi, p_lo = p_hi.view(shape), p_lo.view(shape)
    both, cross = products.attention_sums(p_hi, p_lo, stored.values)  # p_hi hi | p_hi lo, p_lo hi
    return WEIGHTED_MEAN(both.view(-1, 2, d), cross.view(-1, d), z).view(*p.shape[:-1], d), z.view(
        *p.shape[:-1], 1
    ) * 2.0**-prob_bits


def prob_parts(p: Tensor, unit: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Rows of attention weights [N, keys] (float32, in [0, 1]) as hi + lo parts on the grids
    1 / unit and 1 / unit**2, and the rows' exact sums in units of 1 / unit (float64)."""
    scaled = p.double() * unit
    p_hi = scaled.round()
    p_lo = ((scaled - p_hi) * unit).round() / unit
    return p_hi, p_lo, p_hi.sum(-1, keepdim=True) + p_lo.sum(-1, keepdim=True)


def weighted_mean(both: Tensor, cross: Tensor, z: Tensor) -> Tensor:
    """(coarse + (fine + cross)) / z rounded to float32, row by row, for the products of the
    weights' hi part with the values' hi and lo parts (`both` [N, 2, d]), the weights' lo part's
    with the values' hi (`cross` [N, d]) and the weights' sums `z` [N, 1]."""
    return ((both[:, 0] + (both[:, 1] + cross)) / z).float()


def key_values(k: Tensor, v: Tensor, unit: Tensor, grid: Tensor) -> Tensor:
    """`KeyValues` of float32 keys and values [B, kv_heads, T, d]: the keys on fixed-point rows
    of unit = 2**bits, the values on their grid [kv_heads, 1, d]."""
    scaled = v.double() / grid
    hi = scaled.round()
    lo = ((scaled - hi) * 2.0**VALUE_BITS).round() * 2.0**-VALUE_BITS
    return torch.cat((exact.fixed_grid(k, unit), hi * grid, lo * grid), -1)


def queries_key_values(
    qkv: Tensor, cos: Tensor, sin: Tensor, unit: Tensor, grid: Tensor
) -> tuple[Tensor, Tensor]:
    """RoPE at cos and signed sin [B, T, 1, 1, d] on the queries and keys of float32 qkv
    [B, T, groups + 2, kv_heads, d] (the query heads sharing each key-value head, then the keys,
    then the values); the queries on fixed-point rows of unit = 2**bits [B, heads, T, d] and the
    `KeyValues` data [B, kv_heads, T, 3 d] (`key_values`), both float64."""
    qk = rotated(qkv, cos, sin)
    q = qk[:, :, :-1].flatten(2, 3).transpose(1, 2).contiguous()
    k, v = qk[:, :, -1].transpose(1, 2), qkv[:, :, -1].transpose(1, 2)
    return exact.fixed_grid(q, unit), key_values(k, v, unit, grid)


def shifted_scores(raw: Tensor, hidden: Tensor, scale: Tensor) -> Tensor:
    """Exact scores [B, H, Tq, Tk] (float64) rounded to float32 and scaled, the `hidden` keys
    [B, 1, Tq, Tk] at -inf, less each row's largest: the exponent of a probability (in place on
    the rounded scores: no copy per step)."""
    scores = raw.float().mul_(scale).masked_fill_(hidden, float("-inf"))
    return scores.sub_(scores.amax(-1, keepdim=True))


def grouped(x: Tensor, kv_heads: int) -> Tensor:
    """[B, H, T, n] -> [B, kv_heads, H / kv_heads * T, n]: the rows of the heads that share a
    key-value head (grouped-query attention) side by side, for one product with it."""
    batch, heads, rows, n = x.shape
    return x.reshape(batch, kv_heads, heads // kv_heads * rows, n)


def query_chunks(
    positions: Tensor, key_positions: Tensor, heads: int
) -> Iterator[tuple[slice, Tensor]]:
    """The queries at `positions` [B, Tq] in slices of at most ATTENTION_CHUNK scores over all
    heads (at least one query) and at most a quarter of the queries (of at least
    CAUSAL_ROWS), each with its causal mask [B, 1, rows, seen] over the keys at
    `key_positions` [B, Tk] (True where a key is hidden from a query: after it), up to the last
    key any of its queries sees: the keys after those are hidden from the whole slice and
    skipped (about 3/8 of a long sequence's scores)."""
    batch, queries = positions.shape
    keys = key_positions.shape[1]
    size = max(1, ATTENTION_CHUNK // (batch * heads * keys))
    size = min(size, max(CAUSAL_ROWS, -(-queries // 4)))
    for start in range(0, queries, size):
        rows = slice(start, start + size)
        visible = key_positions[:, None, None, :] <= positions[:, None, rows, None]
        seen = int((visible.flatten(0, 2).any(0) * torch.arange(1, keys + 1)).max())
        yield rows, ~visible[..., :seen]  # once per pass, not per layer


def attention_probabilities(fq: Tensor, keys: Tensor, hidden: Tensor) -> Tensor:
    """exp(score - the row's largest score) [B, H, Tq, Tk] (float32) of fixed-point queries over
    keys; each element's bits depend on its row alone (exact scores, the engine's own exp:
    `exact.exponential`)."""
    raw = products.attention_scores(grouped(fq, keys.shape[1]), keys)
    scale = score_scale(fq.shape[-1])
    exponent = SHIFTED_SCORES(raw.view(*fq.shape[:-1], keys.shape[2]), hidden, scale)
    return exact.exponential(exponent)


@functools.cache
def score_scale(head_dim: int) -> Tensor:
    """1 / sqrt(head_dim) in float32, as a kernel's argument (never an inference tensor)."""
    with torch.inference_mode(False):
        return torch.tensor(1.0 / math.sqrt(head_dim), dtype=torch.float32)


def query_rows(q: Tensor) -> Tensor:
    """The queries [..., d] on their fixed-point rows for `attend` (float64)."""
    return exact.fixed_point(q, exact.bits_for(q.shape[-1]))


def attend(
    fq: Tensor,
    stored: KeyValues,
    chunks: list[tuple[slice, Tensor]],
    prob_bits: int,
    check: Check,
    kept: list[Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Causal attention's value [B, H, Tq, d] of queries on fixed-point rows (`query_rows`) over
    `stored` keys and values, exact, chunk by chunk (`query_chunks`; of several, laid out as
    [B, Tq, H, d]: `heads_side_by_side`), and the exact sums of its weights [B, H, Tq, 1]; `kept`
    collects each chunk's normalised probabilities. `check` runs between the stages."""
    outs, sums = [], []
    for rows, hidden in chunks:
        check()
        seen = stored.upto(hidden.shape[-1])
        p = attention_probabilities(fq[:, :, rows], seen.keys, hidden)
        check()
        out, total = attention_weights_times_values(p, seen, prob_bits, check)
        outs.append(out)
        sums.append(total)
        if kept is not None:
            kept.append(NORMALISED(p, total))
    if len(outs) == 1:
        return outs[0], sums[0]
    return heads_side_by_side(outs), torch.cat(sums, 2)


def normalised(p: Tensor, total: Tensor) -> Tensor:
    """Attention weights p [..., keys] (float32) over their rows' exact sums [..., 1] (float64),
    divided in float64 and rounded to float32."""
    return (p.double() / total).float()


def heads_side_by_side(outs: list[Tensor]) -> Tensor:
    """Chunks of queries' values [B, H, rows, d] joined along the queries into [B, Tq, H, d]
    memory, returned as its view [B, H, Tq, d]: one copy, after which the heads side by side
    [B, Tq, H d] that the output projection reads are a view too."""
    batch, heads, _, d = outs[0].shape
    queries = sum(out.shape[2] for out in outs)
    joined = torch.empty(batch, queries, heads, d, dtype=outs[0].dtype)
    torch.cat([out.transpose(1, 2) for out in outs], 1, out=joined)
    return joined.transpose(1, 2)


class Attention(torch.autograd.Function):
    """`attend` (exact in value) with softmax attention's own gradient. The backward recomputes
    each chunk's probabilities (the same bits) from the exact sums the forward kept, unless all
    of them fit in ATTENTION_CHUNK scores (then they are kept), so neither pass holds more than
    that. `chunks` are `query_chunks`'s, shared by every layer of a pass. Without gradients the
    model calls `attend` itself."""

    @staticmethod
    def forward(
        ctx,
        q,
        k,
        v,
        stored: KeyValues,
        chunks: list[tuple[slice, Tensor]],
        prob_bits: int,
        check: Check,
    ):
        keep = ctx.needs_input_grad[0] and q.numel() // q.shape[-1] * k.shape[2] <= ATTENTION_CHUNK
        ctx.probs = [] if keep else None  # small: the probabilities are kept, not recomputed
        fq = query_rows(q)
        out, sums = attend(fq, stored, chunks, prob_bits, check, ctx.probs)
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(q, k, v, sums, out)  # not `stored`: its values are freed
            ctx.chunks = chunks
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, sums, out = ctx.saved_tensors
        kv, scale = k.shape[1], score_scale(q.shape[-1])
        if ctx.probs is None:  # the keys' bits again, as `KeyValues.of` rounded them
            fq = query_rows(q)
            keys = exact.fixed_point(k, exact.bits_for(k.shape[-1]))
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        along = (grad_out * out).sum(-1, keepdim=True)  # each row's sum_j p_j dp_j
        for n, (rows, hidden) in enumerate(ctx.chunks):
            seen = hidden.shape[-1]
            if ctx.probs is not None:
                probs = ctx.probs[n]
            else:
                p = attention_probabilities(fq[:, :, rows], keys[:, :, :seen], hidden)
                probs = NORMALISED(p, sums[:, :, rows].contiguous())
            probs, g = grouped(probs, kv), grouped(grad_out[:, :, rows], kv)
            grad_v[:, :, :seen] += probs.transpose(-1, -2) @ g
            grad_p = g @ v[:, :, :seen].transpose(-1, -2)
            grad_s = SCORE_GRADIENT(grad_p, grouped(along[:, :, rows], kv), probs, scale)
            grad_q[:, :, rows] = (grad_s @ k[:, :, :seen]).view(grad_q[:, :, rows].shape)
            grad_k[:, :, :seen] += grad_s.transpose(-1, -2) @ grouped(q[:, :, rows], kv)
        ctx.probs = ctx.chunks = None
        return grad_q, grad_k, grad_v, None, None, None, None


def score_gradient(grad_p: Tensor, along: Tensor, probs: Tensor, scale: Tensor) -> Tensor:
    """Softmax's gradient to the scaled scores, (grad_p - along) * probs * scale, for the
    gradient to the probabilities and the probabilities [..., keys] (float32), each row's
    sum_j p_j dp_j [..., 1] and the score's scale (float32 0-dim), in that order."""
    return ((grad_p - along) * probs) * scale


class RotatedHeads(torch.autograd.Function):
    """q, k, v [B, heads, T, d] of the qkv projection [B, T, h + 2 kv, d], q and k rotated
    (`rope`), with the bits of the gradient autograd takes of the slices and `rope`: there each
    part's gradient meets the others' zeros, which turn a -0 into +0 (x + 0 is x otherwise),
    so q and k's is (g cos + roll(g signed_sin)) + 0 and v's g + 0, written once each into one
    buffer (a -0 in g itself only reaches a sum that is 0 or holds a nonzero term)."""

    @staticmethod
    def forward(ctx, qkv: Tensor, cos: Tensor, signed_sin: Tensor, h: int):
        rotated = h + (qkv.shape[2] - h) // 2
        kv = qkv.shape[2] - rotated
        heads = qkv.reshape(*qkv.shape[:2], -1, kv, qkv.shape[-1])  # [B, T, h / kv + 2, kv, d]
        qk = ROTATED(heads, cos[:, :, None], signed_sin[:, :, None]).view(qkv[:, :, :rotated].shape)
        ctx.save_for_backward(cos, signed_sin)
        ctx.h = h
        q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, rotated:]
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_q: Tensor, grad_k: Tensor, grad_v: Tensor):
        cos, signed_sin = ctx.saved_tensors
        h, kv = ctx.h, grad_k.shape[1]
        grad_q, grad_k, grad_v = (g.transpose(1, 2) for g in (grad_q, grad_k, grad_v))
        grad_qkv = grad_q.new_empty(*grad_q.shape[:2], h + 2 * kv, grad_q.shape[-1])
        grad_qk, grad_v_part = grad_qkv.split((h + kv, kv), 2)
        rotated = torch.empty_like(grad_qk)
        for out, table in ((grad_qk, cos), (rotated, signed_sin)):
            for part, g in zip(out.split((h, kv), 2), (grad_q, grad_k), strict=True):
                torch.mul(g, table, out=part)
        (low, high), (rotated_low, rotated_high) = grad_qk.chunk(2, -1), rotated.chunk(2, -1)
        low.add_(rotated_high)
        high.add_(rotated_low)
        grad_qk.add_(0.0)
        torch.add(grad_v, 0.0, out=grad_v_part)
        return grad_qkv, None, None, None


class Gated(torch.autograd.Function):
    """silu(gate) * up of the gate and up projections side by side [..., 2 I], with the gradient
    autograd takes of that expression, computed as autograd does (silu's own backward, the
    products with the other factor) without running silu again, into one tensor (no
    concatenation of the halves' gradients)."""

    @staticmethod
    def forward(ctx, gate_up: Tensor) -> Tensor:
        activated = gate_silu(gate_up)
        ctx.save_for_backward(gate_up, activated)
        return activated * gate_up.chunk(2, dim=-1)[1]

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        gate_up, activated = ctx.saved_tensors
        gate, up = gate_up.chunk(2, dim=-1)
        grad_gate_up = torch.empty_like(gate_up)
        grad_gate, grad_up = grad_gate_up.chunk(2, dim=-1)
        torch.ops.aten.silu_backward(grad * up, gate, grad_input=grad_gate)
        torch.mul(grad, activated, out=grad_up)
        return grad_gate_up


class Checkpoint(torch.autograd.Function):
    """The identity, whose backward first calls `check` (which raises to stop the backward)."""

    @staticmethod
    def forward(ctx, x: Tensor, check: Check):
        ctx.check = check
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.check()
        return grad, None


class ExactLinear(torch.autograd.Function):
    """x @ weight.T exact in value (from `fixed`), with plain float gradients."""

    @staticmethod
    def forward(ctx, x, fixed: Tensor, weight: Tensor):
        ctx.save_for_backward(x, weight)
        return exact.linear(x, fixed)

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        grad_x = grad_y @ weight if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[2]:
            grad_w = grad_y.reshape(-1, grad_y.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return grad_x, None, grad_w


class LoraLinear(torch.autograd.Function):
    """x @ W'.T for the merged weights W' = W + scale * B @ A of a group of projections (exact
    in value), with LoRA's gradients to x and to each projection's A and B, from the base
    weights W and the adapters (W' itself is not kept)."""

    @staticmethod
    def forward(ctx, x, fixed: Tensor, bases: tuple[Tensor, ...], scale: float, *adapters: Tensor):
        ctx.save_for_backward(x, *adapters)
        ctx.bases, ctx.scale = bases, scale
        return exact.linear(x, fixed)

    @staticmethod
    def backward(ctx, grad_y):
        x, *adapters = ctx.saved_tensors
        x2, gy = x.reshape(-1, x.shape[-1]), grad_y.reshape(-1, grad_y.shape[-1])
        a_all, bs = torch.cat(adapters[::2]), adapters[1::2]  # the group's A rows [n r, in]
        parts = gy.split([b.shape[0] for b in bs], dim=1)
        # the rank-r products transposed, r the rows of each: BLAS runs [r, rows] @ [rows, out]
        # faster than [out, rows] @ [rows, r] over a column block of gy
        # (docs/measured.md#engine-lora-backward-transposed)
        down_t = torch.cat([b.t() @ part.t() for part, b in zip(parts, bs, strict=True)])
        down_t.mul_(ctx.scale)  # s [g_1 B_1 | ... | g_n B_n] transposed [n r, rows]
        rank = bs[0].shape[1]
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = lora_input_gradient(parts, ctx.bases, down_t.t(), a_all).view(x.shape)
        grad_as = (down_t @ x2).split(rank)
        across = x2 @ a_all.t()  # x A_i^T of every projection of the group [rows, n r]
        grad_bs = [
            (xa.t() @ part).t().mul_(ctx.scale)
            for part, xa in zip(parts, across.split(rank, 1), strict=True)
        ]
        grads = [g for pair in zip(grad_as, grad_bs, strict=True) for g in pair]
        return grad_x, None, None, None, *grads


def lora_input_gradient(
    parts: list[Tensor], bases: tuple[Tensor, ...], down: Tensor, a_all: Tensor
) -> Tensor:
    """sum_i g_i W_i + s (g_i B_i) A_i, LoRA's gradient to a group's input, for the upstream
    gradient's column blocks g_i [rows, out_i] and `down` = s [g_1 B_1 | ... | g_n B_n]: each
    product added into one output by BLAS (no zeroed buffer, no separate additions)."""
    grad_x = parts[0] @ bases[0]
    for part, w in zip(parts[1:], bases[1:], strict=True):
        grad_x.addmm_(part, w)
    return grad_x.addmm_(down, a_all)


class TargetLogprobs(torch.autograd.Function):
    """log_softmax(hidden @ head.T)[target] per position, exact in value (`exact.log_softmax`,
    row by row, so chunking changes no bit): the logits (float32) of blocks of positions of at
    most SAVED_LOGITS logits, each block's product over the head widened 1024 of its rows at a
    time (`products.eager`: no float64 copy of the head), the log-softmax over chunks of the
    block's positions of at most LOGITS_CHUNK logits. The backward keeps the logits where they
    are one block. The gradient is torch's log_softmax's through the float head, for the
    positions whose upstream gradient is not 0 (the others' is 0: a prompt's, weighing 0, needs
    no backward through the vocabulary), chunk by chunk, from the kept logits, else from each
    block's recomputed (float32 BLAS: the same bits on every run of one machine; from kept
    logits with every gradient nonzero, the bits of a plain gather of log_softmax). `check`
    runs before each block and chunk."""

    @staticmethod
    def forward(ctx, hidden: Tensor, fixed: Tensor, weight: Tensor, targets: Tensor, check: Check):
        rows, flat = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1, 1)
        vocab, values, blocks = fixed.shape[0], [], 0
        for block, block_targets in row_chunks(SAVED_LOGITS, vocab, rows, flat):
            check()
            logits = exact.linear(block, fixed)
            for part, target in row_chunks(LOGITS_CHUNK, vocab, logits, block_targets):
                check()
                values.append(exact.log_softmax_at(part, target).squeeze(-1))
            blocks += 1
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(hidden, fixed, weight, targets)
            ctx.kept, ctx.check = logits if blocks == 1 else None, check
        return torch.cat(values).view(targets.shape)

    @staticmethod
    def backward(ctx, grad: Tensor):
        hidden, fixed, weight, targets = ctx.saved_tensors
        rows, flat = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1, 1)
        upstream = grad.reshape(-1, 1)
        live = (upstream[:, 0] != 0).nonzero().squeeze(-1)
        kept = ctx.kept
        scratch = GradientScratch()
        if kept is None:
            grad_hidden = torch.zeros_like(rows)
            for (index,) in row_chunks(SAVED_LOGITS, fixed.shape[0], live):
                ctx.check()
                logits = exact.linear(rows[index], fixed)
                chunks = row_chunks(
                    LOGITS_CHUNK, fixed.shape[0], logits, flat[index], upstream[index]
                )
                for part, target, up in chunks:
                    ctx.check()
                    scratch.logits_gradient(part, target, up, out=part)
                grad_hidden[index] = logits @ weight
        else:
            every = len(live) == len(rows)  # every row live: the kept rows in place, not gathered
            done = 0
            for (index,) in row_chunks(LOGITS_CHUNK, fixed.shape[0], live):
                ctx.check()  # over the kept logits' first rows (live row i >= i is read first)
                into = kept[done : done + len(index)]
                logits = into if every else kept[index]
                scratch.logits_gradient(logits, flat[index], upstream[index], out=into)
                done += len(index)
            grad_hidden = at_rows(kept[:done] @ weight, live, rows)
        ctx.kept = None
        return grad_hidden.view(hidden.shape), None, None, None, None


def at_rows(values: Tensor, index: Tensor, like: Tensor) -> Tensor:
    """`values` at the rows `index` (ascending) of zeros like `like`: `values` itself where the
    index is every row (no zeros, no copy)."""
    if len(index) == len(like):
        return values
    spread = torch.zeros_like(like)
    spread[index] = values
    return spread


class GradientScratch:
    """The gradient to the logits of log_softmax(logits) gathered at `targets`, as autograd
    computes it, chunk after chunk of one backward, in two buffers of the first (largest) chunk
    reused by every chunk: a fresh pair per chunk (16 MB each on SmolLM2) costs its page faults
    and a zero fill every time."""

    def __init__(self) -> None:
        self.zeros: Tensor | None = None  # all zeros between calls
        self.soft: Tensor | None = None

    def logits_gradient(self, logits: Tensor, targets: Tensor, grad: Tensor, out: Tensor) -> Tensor:
        """Scattered (added into zeros), through log_softmax's backward (row by row), written
        into `out` (`logits` itself may be: they are read before it is written)."""
        if self.zeros is None:
            self.zeros, self.soft = torch.zeros_like(logits), torch.empty_like(logits)
        zeros, soft = self.zeros[: len(logits)], self.soft[: len(logits)]
        grad_logits = zeros.scatter_add_(-1, targets, grad)
        torch._log_softmax(logits, -1, False, out=soft)
        torch._log_softmax_backward_data(grad_logits, soft, -1, logits.dtype, out=out)
        zeros.scatter_(-1, targets, 0.0)
        return out


def row_chunks(limit: int, vocab: int, *tensors: Tensor) -> list[tuple[Tensor, ...]]:
    """The tensors split alike along their first dim, into chunks of at most `limit` logits (at
    least a row), a multiple of BLAS_ROWS rows where that is at least BLAS_ROWS."""
    size = max(1, limit // vocab)
    if size > BLAS_ROWS:
        size -= size % BLAS_ROWS
    return list(zip(*(t.split(size) for t in tensors), strict=True))


@dataclass(frozen=True)
class LayerWeights:
    """One layer's projections on fixed-point rows (grouped), its value grid, the biases of its
    groups that have them (Qwen2's qkv), and for training the base weights and adapters the
    gradients need."""

    fixed: dict[str, Tensor]
    value_grid: Tensor
    bases: dict[str, tuple[Tensor, ...]]
    adapters: dict[str, tuple[Tensor, ...]]
    biases: dict[str, Tensor]


@dataclass(frozen=True)
class Pass:
    """What every layer of one pass over token positions [B, T] shares, computed once per pass
    (for a decode step, once per step): RoPE's cos and sin at the positions [B, T, 1, d], how
    many keys the pass sees (with a cache, up to the furthest position written), the
    attention's query chunks with their causal masks (`query_chunks`), and with a cache the
    rows of its layers' tensors viewed as [B * kv_heads * length, 3 d] that the pass writes, in
    the order of a `KeyValues` [B, kv_heads, T] (`KVCache.slots`)."""

    positions: Tensor
    cos: Tensor
    sin: Tensor
    keys: int
    chunks: list[tuple[slice, Tensor]]
    slots: Tensor | None

    @classmethod
    def of(cls, model: Llama, positions: Tensor, cache: KVCache | None) -> Pass:
        batch, length = positions.shape
        keys = int(positions.max()) + 1 if cache is not None else length
        key_positions = torch.arange(keys).expand(batch, -1) if cache is not None else positions
        chunks = list(query_chunks(positions, key_positions, model.cfg.num_heads))
        cos, sin = model.cos[positions][:, :, None], model.sin[positions][:, :, None]
        slots = None if cache is None else cache.slots(positions)
        return cls(positions, cos, sin, keys, chunks, slots)

    @functools.cached_property
    def rotation(self) -> tuple[Tensor, Tensor]:
        """cos and signed sin [B, T, 1, 1, d] for the fused queries and keys without gradients
        (`queries_key_values`): made on the first layer's call, not again for each layer."""
        return self.cos[:, :, None], self.sin[:, :, None]


class KVCache:
    """Keys (fixed point) and values (on their grid) of every layer (`KeyValues`) for `batch`
    rows of up to `length` positions; `positions[r]` is the next position of row r.

    Stored as float32 (half float64's bytes, which each decode step reads): every number is
    exact in float32. A key is an integer of at most bits_for(d) <= 24 bits times its row's
    step, a power of two of at least 2**-123 (`exact.fixed_grid`). A value's hi part is v's
    quotient by its grid (a power of two in [2**-120, 2**103] for any model whose values' bound,
    `value_grid`, stays below 2**123) rounded to an integer: below 2**24 in magnitude it is such
    an integer (at most 2**24) times the grid, above it v itself (a float32 whose quotient is
    already an integer); its lo part is an integer of at most 20 bits times the grid over
    2**VALUE_BITS (at least 2**-141, a multiple of float32's least step 2**-149)."""

    def __init__(self, cfg: ModelConfig, batch: int, length: int) -> None:
        self.shape = (batch, cfg.kv_heads, length, 3 * cfg.dim_head)
        self.stored = [torch.zeros(self.shape) for _ in range(cfg.num_layers)]
        self.positions = torch.zeros(batch, dtype=torch.long)

    def rows(self, index: Tensor) -> KVCache:
        """A cache of the given rows (copies), e.g. a prompt's cache for each of its samples."""
        out = KVCache.__new__(KVCache)
        out.shape = (len(index), *self.shape[1:])
        out.stored = [s[index] for s in self.stored]
        out.positions = self.positions[index].clone()
        return out

    def slots(self, positions: Tensor) -> Tensor:
        """The rows [B * kv_heads * T] of a layer's tensor viewed as [B * kv_heads * length,
        3 d] that hold each batch row's keys and values at `positions` [B, T], in the order of
        a `KeyValues` [B, kv_heads, T]."""
        batch, heads, length, _ = self.shape
        first = (torch.arange(batch)[:, None] * heads + torch.arange(heads)) * length
        return (first[:, :, None] + positions[:, None, :]).reshape(-1)

    def write(self, n: int, k: Tensor, v: Tensor, grid: Tensor, step: Pass) -> KeyValues:
        """Store keys/values [B, kv_heads, T, d] at each row's positions (`store`)."""
        return self.store(n, KeyValues.of(k, v, grid).data, step)

    def store(self, n: int, new: Tensor, step: Pass) -> KeyValues:
        """Store the `KeyValues` data [B, kv_heads, T, 3 d] (float64) at each row's positions
        (`step`'s slots, one row copy each, as float32: exact); return the keys and values of
        layer n up to the furthest position written (the rest are invisible)."""
        stored = self.stored[n]
        rows = new.reshape(-1, new.shape[-1]).float()
        stored.view(-1, stored.shape[-1]).index_copy_(0, step.slots, rows)
        return KeyValues(stored[:, :, : step.keys])


class Llama:
    """The decoder over a weight dict: with `lora`, the trainer (LoRA applied through the merged
    weights, with LoRA's gradients); without, frozen weights (a sampler snapshot or a base)."""

    def __init__(
        self,
        cfg: ModelConfig,
        weights: dict[str, Tensor],
        lora: Lora | None = None,
        head: Tensor | None = None,
    ):
        """`head`: `exact.weight` of weights["lm_head.weight"] if already built (another model
        over the same base)."""
        self.cfg, self.w, self.lora = cfg, weights, lora
        self.cos, self.sin = rope_tables(cfg)
        self.head = exact.weight(weights["lm_head.weight"]) if head is None else head
        self.frozen: list[LayerWeights] | None = None

    def layer_weights(self, built: list[LayerWeights] | None = None) -> list[LayerWeights]:
        """Fixed-point weights for one forward: built once for frozen weights, per call for the
        trainer (its adapter changes with every step). `built`: another model's layers over the
        same merged weights (a sampler's and the trainer's of one weights version), whose
        fixed-point weights, value grids and biases are taken as they are (the merge is exact:
        `Lora.merged_weight`)."""
        if self.lora is None and self.frozen is not None:
            return self.frozen
        layers = []
        with torch.no_grad():
            for n in range(self.cfg.num_layers):
                p = f"model.layers.{n}."
                if built is None:
                    fixed, grid, biases = self.fixed_layer(n)
                else:
                    fixed, grid, biases = built[n].fixed, built[n].value_grid, built[n].biases
                adapters = {}
                if self.lora is not None:
                    for group, names in GROUPS.items():
                        adapters[group] = tuple(
                            t for name in names for t in self.lora.adapter(p + name)
                        )
                bases = {
                    group: tuple(self.w[p + name + ".weight"] for name in names)
                    for group, names in GROUPS.items()
                }
                layers.append(LayerWeights(fixed, grid, bases, adapters, biases))
        if self.lora is None:
            self.frozen = layers
        return layers

    def fixed_layer(self, n: int) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor]]:
        """Layer n's merged projections on fixed-point rows (by group), value grid and biases."""
        p = f"model.layers.{n}."
        merged = {}
        for group, names in GROUPS.items():
            parts = [self.projection(p + name) for name in names]
            merged[group] = torch.cat(parts) if len(parts) > 1 else parts[0]
        k = self.cfg.kv_heads * self.cfg.dim_head
        biases = {}
        if self.cfg.attention_bias:
            names = ("q_proj", "k_proj", "v_proj")
            biases["qkv"] = torch.cat([self.w[f"{p}self_attn.{n}.bias"] for n in names])
        grid = value_grid(
            merged["qkv"][-k:],
            self.w[p + "input_layernorm.weight"],
            self.cfg,
            biases["qkv"][-k:] if biases else None,
        )
        return {group: exact.weight(w) for group, w in merged.items()}, grid, biases

    def projection(self, name: str) -> Tensor:
        w = self.w[name + ".weight"]
        return w if self.lora is None else self.lora.merged_weight(w, name)

    def linear(self, x: Tensor, layer: LayerWeights, group: str) -> Tensor:
        if self.lora is not None and torch.is_grad_enabled():
            y = LoraLinear.apply(
                x, layer.fixed[group], layer.bases[group], self.lora.scale, *layer.adapters[group]
            )
        else:
            y = exact.linear(x, layer.fixed[group])
        bias = layer.biases.get(group)
        return y if bias is None else y + bias

    def attention(
        self,
        x: Tensor,
        n: int,
        layer: LayerWeights,
        step: Pass,
        cache: KVCache | None,
        check: Check = no_check,
    ) -> Tensor:
        cfg = self.cfg
        B, T, _ = x.shape
        h, kv, d = cfg.num_heads, cfg.kv_heads, cfg.dim_head
        qkv = self.linear(x, layer, "qkv").view(B, T, h + 2 * kv, d)
        if not torch.is_grad_enabled():  # one fused kernel, the same bits
            unit = exact.power(exact.bits_for(d))
            both = qkv.view(B, T, h // kv + 2, kv, d), *step.rotation
            fq, new = QUERIES_KEY_VALUES(*both, unit, layer.value_grid)
            stored = KeyValues(new) if cache is None else cache.store(n, new, step)
            y, _ = attend(fq, stored, step.chunks, cfg.prob_bits, check)
            return self.linear(y.transpose(1, 2).reshape(B, T, h * d), layer, "o")
        q, k, v = RotatedHeads.apply(qkv, step.cos, step.sin, h)
        if cache is None:
            stored = KeyValues.of(k, v, layer.value_grid)
        else:
            stored = cache.write(n, k, v, layer.value_grid, step)
        if q.requires_grad:
            y = Attention.apply(q, k, v, stored, step.chunks, cfg.prob_bits, check)
        else:
            y, _ = attend(query_rows(q), stored, step.chunks, cfg.prob_bits, check)
        return self.linear(y.transpose(1, 2).reshape(B, T, h * d), layer, "o")

    def mlp(self, x: Tensor, layer: LayerWeights) -> Tensor:
        gate_up = self.linear(x, layer, "gate_up")
        if torch.is_grad_enabled():
            return self.linear(Gated.apply(gate_up), layer, "down")
        return self.linear(gated_rows(gate_silu(gate_up), gate_up), layer, "down")

    def hidden(
        self,
        ids: Tensor,
        cache: KVCache | None = None,
        layers: list[LayerWeights] | None = None,
        check: Check | None = None,
        recompute: bool = False,
    ) -> Tensor:
        """Final-norm hidden states [B, T, hidden] of token ids [B, T]; right padding is harmless
        (causal attention never looks ahead). With a cache, continues at each row's position;
        `layers` reuses the weights of `layer_weights()` across calls. `check` is called before
        each attention and MLP, between the attention's stages and, in the backward, after each
        layer's (it raises to stop the work). `recompute` keeps only the input of each segment
        of about sqrt(layers) layers for the backward and runs the segment again there (the same
        bits: its arithmetic is exact)."""
        B, T = ids.shape
        start = torch.zeros(B, dtype=torch.long) if cache is None else cache.positions
        step = Pass.of(self, start[:, None] + torch.arange(T)[None, :], cache)
        x = F.embedding(ids, self.w["model.embed_tokens.weight"])
        probe = check or no_check
        layers = layers or self.layer_weights()
        recompute = recompute and torch.is_grad_enabled()
        size = math.isqrt(len(layers)) if recompute else 1
        for first in range(0, len(layers), size):
            span = range(first, min(first + size, len(layers)))
            if recompute:
                x = torch.utils.checkpoint.checkpoint(
                    self.blocks,
                    x,
                    span,
                    layers,
                    step,
                    cache,
                    probe,
                    use_reentrant=False,
                    preserve_rng_state=False,
                )
            else:
                x = self.blocks(x, span, layers, step, cache, probe)
            if check is not None and x.requires_grad:
                x = Checkpoint.apply(x, check)
        if cache is not None:
            cache.positions += T
        return rms_norm(x, self.w["model.norm.weight"], self.cfg.rms_eps)

    def blocks(
        self,
        x: Tensor,
        span: range,
        layers: list[LayerWeights],
        step: Pass,
        cache: KVCache | None,
        probe: Check,
    ) -> Tensor:
        """Decoder layers `span`, one after the other."""
        for n in span:
            x = self.block(x, n, layers[n], step, cache, probe)
        return x

    def block(
        self,
        x: Tensor,
        n: int,
        layer: LayerWeights,
        step: Pass,
        cache: KVCache | None,
        probe: Check,
    ) -> Tensor:
        """Decoder layer n: x plus attention, plus the MLP."""
        probe()
        p = f"model.layers.{n}."
        if not torch.is_grad_enabled():  # each norm fused with its residual add and rounding
            eps = self.cfg.rms_eps
            _, attn_in = norm_rows(x, self.w[p + "input_layernorm.weight"], eps)
            delta = self.attention(attn_in, n, layer, step, cache, probe)
            probe()
            w = self.w[p + "post_attention_layernorm.weight"]
            x, mlp_in = norm_rows(x, w, eps, delta)
            return x + self.mlp(mlp_in, layer)
        attn_in = rms_norm(x, self.w[p + "input_layernorm.weight"], self.cfg.rms_eps)
        x = x + self.attention(attn_in, n, layer, step, cache, probe)
        probe()
        mlp_in = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.cfg.rms_eps)
        return x + self.mlp(mlp_in, layer)

    def target_logprobs(self, hidden: Tensor, targets: Tensor, check: Check = no_check) -> Tensor:
        """log p(target | position) for hidden states [..., hidden] and targets [...]."""
        return TargetLogprobs.apply(hidden, self.head, self.w["lm_head.weight"], targets, check)

    def logits(self, hidden: Tensor) -> Tensor:
        if torch.is_grad_enabled() and hidden.requires_grad:
            return ExactLinear.apply(hidden, self.head, self.w["lm_head.weight"])
        return exact.linear(hidden, self.head)


WIDE = 67
"""An innermost size the load check includes for every kernel: past a vector loop's lanes (16
float32 on AVX-512), so that loop runs and not only its tail."""


def attention_examples() -> list[tuple]:
    """Attention weights [N, keys] to compile `prob_parts` on."""
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(6, 40, generator=gen)
    return [
        (p, exact.power(20, torch.float64)),
        (p[2:3, :3].clone(), exact.power(21, torch.float64)),
        (torch.rand(3, WIDE, generator=gen), exact.power(20, torch.float64)),
    ]


def mean_examples() -> list[tuple]:
    gen = torch.Generator().manual_seed(0)
    both = torch.randn(6, 2, 8, dtype=torch.float64, generator=gen)
    cross = torch.rand(6, 8, dtype=torch.float64, generator=gen)
    z = torch.rand(6, 1, dtype=torch.float64, generator=gen) + 1
    wide = (
        torch.randn(3, 2, WIDE, dtype=torch.float64, generator=gen),
        torch.rand(3, WIDE, dtype=torch.float64, generator=gen),
        z[:3].clone(),
    )
    return [(both, cross, z), (both[:1].clone(), cross[:1].clone(), z[:1].clone()), wide]


def key_value_examples() -> list[tuple]:
    gen = torch.Generator().manual_seed(0)
    grid = exact.pow2(torch.randint(-12, -8, (3, 1, 8), generator=gen))
    k, v = torch.randn(2, 3, 5, 8, generator=gen) * 3, torch.randn(2, 3, 5, 8, generator=gen)
    unit = exact.power(21)
    first = (k[:1, :, :1].clone(), v[:1, :, :1].clone(), unit, grid)
    wide_grid = exact.pow2(torch.randint(-12, -8, (3, 1, WIDE), generator=gen))
    wide_k, wide_v = (torch.randn(1, 3, 4, WIDE, generator=gen) for _ in range(2))
    return [(k, v, unit, grid), first, (wide_k * 3, wide_v, unit, wide_grid)]


def query_key_value_examples() -> list[tuple]:
    """qkv of 2 query heads per key-value head, 3 of those, RoPE's tables at random angles."""
    gen = torch.Generator().manual_seed(0)
    grid = exact.pow2(torch.randint(-12, -8, (3, 1, 8), generator=gen))
    qkv = torch.randn(2, 5, 4, 3, 8, generator=gen) * 3
    angles = torch.rand(2, 5, 1, 1, 8, generator=gen) * 6
    cos, sin = angles.cos(), angles.sin()
    unit = exact.power(21)
    first = (qkv[:1, :1].clone(), cos[:1, :1].clone(), sin[:1, :1].clone(), unit, grid)
    d = WIDE + 1  # RoPE's halves
    wide_grid = exact.pow2(torch.randint(-12, -8, (3, 1, d), generator=gen))
    wide_angles = torch.rand(1, 3, 1, 1, d, generator=gen) * 6
    wide_qkv = torch.randn(1, 3, 4, 3, d, generator=gen) * 3
    wide = (wide_qkv, wide_angles.cos(), wide_angles.sin(), unit, wide_grid)
    return [(qkv, cos, sin, unit, grid), first, wide]


def score_examples() -> list[tuple]:
    gen = torch.Generator().manual_seed(0)
    raw = torch.randn(2, 4, 5, 7, dtype=torch.float64, generator=gen) * 30
    hidden = torch.arange(7)[None, None, None, :] > torch.arange(2, 7)[None, None, :, None]
    hidden = hidden.expand(2, 1, 5, 7).contiguous()
    wide_raw = torch.randn(1, 4, 3, WIDE, dtype=torch.float64, generator=gen) * 30
    wide_hidden = (torch.arange(WIDE) > torch.arange(60, 63)[:, None])[None, None]
    return [
        (raw, hidden, score_scale(32)),
        (raw[:1, :, :1].clone(), hidden[:1, :, :1].clone(), score_scale(64)),
        (wide_raw, wide_hidden, score_scale(32)),
    ]


def norm_examples() -> list[tuple]:
    """Rows [N, K], eps and unit of K = 96 and of a row of 70."""
    gen = torch.Generator().manual_seed(0)
    found = []
    for n, k, eps in ((5, 96, 1e-5), (1, 70, 1e-6)):
        x = torch.randn(n, k, generator=gen) * 3
        x[1:2] *= 2.0**-70  # a row far below eps (none in a one-row example)
        found.append((x, epsilon(eps), exact.power(exact.bits_for(k))))
    return found


def residual_norm_examples() -> list[tuple]:
    gen = torch.Generator().manual_seed(1)
    return [(x, torch.randn(x.shape, generator=gen), *rest) for x, *rest in norm_examples()]


def scaled_examples() -> list[tuple]:
    """`norm_examples`' rows with a norm weight [K], their roots and the room of K."""
    gen = torch.Generator().manual_seed(2)
    found = []
    for x, eps, unit in norm_examples():
        k = x.shape[-1]
        weight = torch.rand(k, generator=gen) + 0.5
        found.append((x, weight, norm_root(x, eps, unit), exact.room(exact.weight_bits(k))))
    return found


def norm_scaled_examples() -> list[tuple]:
    """`scaled_examples`' rows, roots and weights."""
    return [(x, root, weight) for x, weight, root, _ in scaled_examples()]


def norm_gradient_examples() -> list[tuple]:
    """Upstream gradients (zeros of both signs among them) over `scaled_examples`' rows."""
    gen = torch.Generator().manual_seed(3)
    found = []
    for x, weight, root, _ in scaled_examples():
        grad = torch.randn(x.shape, generator=gen)
        grad[0, ::5], grad[0, 1::5] = 0.0, -0.0
        found.append((grad, weight, x, root))
    return found


def norm_mean_examples() -> list[tuple]:
    gen = torch.Generator().manual_seed(4)
    return [(x, torch.randn(root.shape, generator=gen)) for x, _, root, _ in scaled_examples()]


def normalised_examples() -> list[tuple]:
    """Weights [B, H, rows, keys] (hidden keys at 0) and their rows' sums, 40 and WIDE keys."""
    gen = torch.Generator().manual_seed(6)
    found = []
    for shape in ((2, 3, 5, 40), (1, 1, 1, 3), (1, 2, 3, WIDE)):
        p = torch.rand(shape, generator=gen)
        p[..., -1] = 0.0
        found.append((p, p.double().sum(-1, keepdim=True) + 0.5))
    return found


def rotated_examples() -> list[tuple]:
    """`query_key_value_examples`' heads and tables."""
    return [(qkv, cos, sin) for qkv, cos, sin, _, _ in query_key_value_examples()]


def score_gradient_examples() -> list[tuple]:
    """Probabilities' gradients and probabilities [B, kv, rows, keys] (hidden keys at 0), each
    row's sum_j p_j dp_j and the scale of head sizes 64 and 96."""
    gen = torch.Generator().manual_seed(5)
    found = []
    for shape, d in (((2, 3, 5, 7), 64), ((1, 1, 1, 3), 96), ((1, 2, 3, WIDE), 64)):
        probs = torch.rand(shape, generator=gen)
        probs[..., -1] = 0.0
        grad_p = torch.randn(shape, generator=gen)
        along = (grad_p * probs).sum(-1, keepdim=True)
        found.append((grad_p, along, probs, score_scale(d)))
    return found


def gated_examples() -> list[tuple]:
    gen = torch.Generator().manual_seed(0)
    found = []
    for (x,) in exact.examples():
        gate_up = torch.randn(x.shape[0], 2, x.shape[1], generator=gen)
        found.append((x, gate_up, exact.room(exact.weight_bits(x.shape[1]))))
    return found


PROB_PARTS = kernels.kernel(attention_examples)(prob_parts)
WEIGHTED_MEAN = kernels.kernel(mean_examples)(weighted_mean)
KEY_VALUES = kernels.kernel(key_value_examples)(key_values)
SHIFTED_SCORES = kernels.kernel(score_examples, eager_from=1 << 14)(shifted_scores)
GATED_GRID = kernels.kernel(gated_examples)(gated_grid)
QUERIES_KEY_VALUES = kernels.kernel(query_key_value_examples)(queries_key_values)
NORM_ROOT = kernels.kernel(norm_examples)(norm_root)
RESIDUAL_NORM_ROOT = kernels.kernel(residual_norm_examples)(residual_norm_root)
SCALED_GRID = kernels.kernel(scaled_examples)(scaled_grid)
NORM_SCALED = kernels.kernel(norm_scaled_examples)(norm_scaled)
NORM_GRADIENT_PARTS = kernels.kernel(norm_gradient_examples)(norm_gradient_parts)
NORM_MEAN_GRADIENT = kernels.kernel(norm_mean_examples)(norm_mean_gradient)
SCORE_GRADIENT = kernels.kernel(score_gradient_examples)(score_gradient)
NORMALISED = kernels.kernel(normalised_examples)(normalised)
ROTATED = kernels.kernel(rotated_examples)(rotated)
