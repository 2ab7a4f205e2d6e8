"""Batched decoding of one sample request (num_samples rows) with a pre-allocated KV cache:
temperature, top_k, top_p, stop tokens; every draw by inverse CDF from a per-row generator."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import Tensor

from whitney.local.engine.model import FrozenLlama, KVCache


@dataclass(frozen=True)
class SamplingParams:
    """A SampleRequest's sampling_params; temperature 0 means greedy (top_k = 1)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop_token_ids: tuple[int, ...] = ()


def row_seed(seed: int, row: int) -> int:
    """The generator seed of sample `row` of a request seeded with `seed`."""
    digest = hashlib.sha256(f"whitney-sample:{seed}:{row}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def sampling_logprobs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Log-probabilities [B, V] of the distribution sampled from: softmax(logits / T), truncated
    to the top_k tokens, then to the smallest set reaching top_p mass, renormalised."""
    temperature, top_k = params.temperature, params.top_k
    if temperature == 0:
        temperature, top_k = 1.0, 1
    if temperature != 1.0:
        logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        probs = logits.softmax(-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop = torch.empty_like(order, dtype=torch.bool).scatter_(
            -1, order, mass_before >= params.top_p
        )
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.log_softmax(-1)


def draw(logprobs: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draw per row: the first token whose cumulative probability exceeds u * total."""
    probs = logprobs.exp()
    cdf = probs.cumsum(-1)
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    last_possible = (probs > 0).cumsum(-1).argmax(-1)  # guards u * total rounding up to total
    return torch.minimum(tokens, last_possible)


def sample(
    model: FrozenLlama, prompt: list[int], num_samples: int, params: SamplingParams, seed: int
) -> list[dict]:
    """`num_samples` continuations of `prompt`: SampleResult sequences. The prompt is prefilled
    once and shared by every row; row r draws from its own generator seeded by (seed, r)."""
    n, max_tokens = num_samples, params.max_tokens
    u = torch.stack(
        [
            torch.rand(max_tokens, generator=torch.Generator().manual_seed(row_seed(seed, r)))
            for r in range(n)
        ]
    )
    stops = torch.tensor(sorted(set(params.stop_token_ids) | set(model.cfg.eos_token_ids)))
    cache = KVCache(model.cfg, n, len(prompt) + max_tokens)
    logits = model.logits(model.hidden(torch.tensor([prompt]), cache)[:, -1]).expand(n, -1)
    tokens = torch.zeros(n, max_tokens, dtype=torch.long)
    logprobs = torch.zeros(n, max_tokens)
    lengths = torch.full((n,), max_tokens)
    done = torch.zeros(n, dtype=torch.bool)
    for t in range(max_tokens):
        lp = sampling_logprobs(logits, params)
        tok = draw(lp, u[:, t])
        tokens[:, t] = tok
        logprobs[:, t] = lp.gather(-1, tok[:, None]).squeeze(-1)
        stopped = ~done & torch.isin(tok, stops)
        lengths[stopped] = t + 1
        done |= stopped
        if t + 1 == max_tokens or bool(done.all()):
            break
        logits = model.logits(model.hidden(tok[:, None], cache)[:, -1])
    return [
        {
            "tokens": tokens[r, : lengths[r]].tolist(),
            "logprobs": logprobs[r, : lengths[r]].tolist(),
            "stop_reason": "stop" if done[r] else "length",
        }
        for r in range(n)
    ]
