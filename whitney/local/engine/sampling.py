"""Batched decoding of sample requests with a pre-allocated KV cache: temperature, top_k, top_p,
stop tokens; every draw by inverse CDF from a per-row generator. A `Watch` is shown each token
step as it is drawn (the OpenAI-compatible routes stream from it)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from whitney.local.engine import exact
from whitney.local.engine.model import Check, KVCache, Llama, no_check
from whitney.local.engine.validation import SampleSpec, SamplingParams


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
        probs = exact.exponential(exact.log_softmax(logits))
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop = torch.empty_like(order, dtype=torch.bool).scatter_(
            -1, order, mass_before >= params.top_p
        )
        logits = logits.masked_fill(drop, float("-inf"))
    return exact.log_softmax(logits)


def draw(logprobs: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draw per row: the first token whose cumulative probability exceeds u * total."""
    probs = exact.exponential(logprobs)
    cdf = probs.cumsum(-1)
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    past = tokens == cdf.shape[-1]  # u * total rounded up to the total: the last possible token
    if bool(past.any()):
        tokens[past] = (probs[past] > 0).cumsum(-1).argmax(-1)
    return tokens


def uniforms(spec: SampleSpec, steps: int) -> Tensor:
    """[num_samples, steps] draws: row r's from its own generator seeded by (seed, r)."""
    rows = [
        torch.rand(
            spec.params.max_tokens, generator=torch.Generator().manual_seed(row_seed(spec.seed, r))
        )
        for r in range(spec.num_samples)
    ]
    return torch.nn.functional.pad(torch.stack(rows), (0, steps - spec.params.max_tokens))


@dataclass(frozen=True)
class Step:
    """The tokens one decode step drew, for the rows still sampling before it (rows numbered
    over the requests in order, a request's samples together): each token, its logprob at
    temperature 1 (the `logprobs` operation's value for it, bit for bit), the `Watch.top` most
    likely tokens at temperature 1 with theirs (most likely first, ties by token id), and how
    the row ended at this step ("stop", "length") or None."""

    rows: list[int]
    tokens: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]
    ends: list[str | None]


@dataclass(frozen=True)
class Watch:
    """Who `sample` shows each token step as it is drawn. `on_step` returns the rows to end
    now, as a stop token would (their sequences end with this step's token, "stop")."""

    on_step: Callable[[Step], Collection[int]]
    top: int = 0


def watched_step(
    logits: Tensor, tokens: Tensor, active: Tensor, stopped: Tensor, done: Tensor, top: int
) -> Step:
    """The `Step` of the `active` rows, drawn from `logits` (what a `Watch` is shown)."""
    rows = active.nonzero().squeeze(-1)
    base = exact.log_softmax(logits[rows])
    drawn = tokens[rows]
    chosen = base.gather(-1, drawn[:, None]).squeeze(-1)
    best: list[list[tuple[int, float]]] = [[] for _ in rows.tolist()]
    if top:
        values, order = base.sort(dim=-1, descending=True, stable=True)
        best = [
            list(zip(ids, lps, strict=True))
            for ids, lps in zip(order[:, :top].tolist(), values[:, :top].tolist(), strict=True)
        ]
    ends = [
        ("stop" if bool(stopped[r]) else "length") if bool(done[r]) else None for r in rows.tolist()
    ]
    return Step(rows.tolist(), drawn.tolist(), chosen.tolist(), best, ends)


def sample(
    model: Llama, specs: list[SampleSpec], check: Check = no_check, watch: Watch | None = None
) -> list[list[dict]]:
    """SampleResult sequences for each request, all decoded together: each prompt is prefilled
    once and shared by its samples; row r of a request draws from its own generator seeded by
    (seed, r). The engine's arithmetic is batch-invariant, so a request's result is bitwise the
    same alone or beside others, and each sampled token's logprob at temperature 1 equals the
    one a forward of the whole sequence computes. `check` is called before every token step
    (and each prefill layer); it raises to stop the decode. A `watch` sees each step as it is
    drawn and may end rows; the other rows' numbers do not change."""
    cfg, steps = model.cfg, max(s.params.max_tokens for s in specs)
    prompt_lengths = torch.tensor([len(s.prompt) for s in specs])
    prompts = torch.zeros(len(specs), int(prompt_lengths.max()), dtype=torch.long)
    for i, spec in enumerate(specs):
        prompts[i, : len(spec.prompt)] = torch.tensor(spec.prompt)
    length = max(len(s.prompt) + s.params.max_tokens for s in specs)
    cache = KVCache(cfg, len(specs), length)
    last = model.hidden(prompts, cache, check=check)[torch.arange(len(specs)), prompt_lengths - 1]
    owner = torch.tensor([i for i, s in enumerate(specs) for _ in range(s.num_samples)])
    logits = model.logits(last)[owner]
    cache = cache.rows(owner)
    cache.positions = prompt_lengths[owner].clone()
    limit = torch.tensor([s.params.max_tokens for s in specs])[owner]
    last_position = cache.positions + limit - 1
    u = torch.cat([uniforms(s, steps) for s in specs])
    stop = torch.zeros(len(specs), cfg.vocab_size, dtype=torch.bool)
    for i, spec in enumerate(specs):
        ids = set(spec.params.stop_token_ids) | set(cfg.eos_token_ids)
        stop[i, [t for t in ids if 0 <= t < cfg.vocab_size]] = True
    stop = stop[owner]
    members: dict[SamplingParams, list[int]] = {}
    for row, i in enumerate(owner.tolist()):
        members.setdefault(replace(specs[i].params, max_tokens=0, stop_token_ids=()), []).append(
            row
        )
    groups = {params: torch.tensor(rows) for params, rows in members.items()}
    rows = len(owner)
    everyone = torch.arange(rows)
    tokens = torch.zeros(rows, steps, dtype=torch.long)
    logprobs = torch.zeros(rows, steps)
    lengths = limit.clone()
    done = torch.zeros(rows, dtype=torch.bool)
    stopped = torch.zeros(rows, dtype=torch.bool)
    for t in range(steps):
        check()
        for params, index in groups.items():
            lp = sampling_logprobs(logits[index], params)
            tok = draw(lp, u[index, t])
            tokens[index, t] = tok
            logprobs[index, t] = lp.gather(-1, tok[:, None]).squeeze(-1)
        active = ~done
        ends = active & stop[everyone, tokens[:, t]]
        lengths[ends] = t + 1
        stopped |= ends
        done |= ends | (t + 1 >= limit)
        if watch is not None:
            step = watched_step(logits, tokens[:, t], active, stopped, done, watch.top)
            ended = torch.tensor(sorted(set(watch.on_step(step))), dtype=torch.long)
            ended = ended[~done[ended]]
            lengths[ended] = t + 1
            stopped[ended] = True
            done[ended] = True
        if bool(done.all()):
            break
        cache.positions = torch.minimum(cache.positions, last_position)  # finished rows idle
        logits = model.logits(model.hidden(tokens[:, t : t + 1], cache)[:, -1])
    results, row = [], 0
    for spec in specs:
        sequences = []
        for r in range(row, row + spec.num_samples):
            n = int(lengths[r])
            sequences.append(
                {
                    "tokens": tokens[r, :n].tolist(),
                    "logprobs": logprobs[r, :n].tolist(),
                    "stop_reason": "stop" if stopped[r] else "length",
                }
            )
        results.append(sequences)
        row += spec.num_samples
    return results
