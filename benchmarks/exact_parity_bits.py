"""How the engine's parity with transformers on SmolLM2 depends on the bits of its exact
projections: the largest difference of a target token's logprob, engine against transformers
in float64 (the truth) and in float32, for the base model and for the base with a merged
rank-8 adapter of random full-mantissa weights (what training makes of the weights), under
three ways of sharing float64's 53 bits between a projection's two operand rows:

- equal: both rows `bits_for(K)` (what the engine did before);
- fixed uneven: the activation row 24 bits, the weight row the rest (K * 2**(24 + b) <= 2**53);
- the engine's: the activation row 24 bits unless its own magnitudes need fewer, the weight
  row `weight_bits(K)` (WEIGHT_HEADROOM bits more than the fixed uneven split).

Every product and partial sum is an exact float64 integer under all three. An experiment on
the engine's arithmetic (the first two replace `exact.linear` and `exact.weight` for their
run); the engine itself is unchanged.

    python benchmarks/exact_parity_bits.py [--model gguf/SmolLM2-135M-Instruct-Q4_1]
        [--adapter-scale 0.05] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from contextlib import nullcontext
from unittest import mock

import torch
from torch import Tensor

from whitney import hf_cache
from whitney.local.engine import exact, hf_backend
from whitney.local.engine.model import GROUPS, Llama

CHATS = [
    [("user", "What is 3 + 4?"), ("assistant", "3 + 4 = 7")],
    [("user", "What is 8 + 1?"), ("assistant", "8 + 1 = 9")],
    [
        ("user", "Write a long, detailed story about a lighthouse keeper and a storm."),
        ("assistant", "The keeper climbed the stairs as the wind rose over the black water."),
    ],
]
Scheme = tuple[Callable[[Tensor, Tensor], Tensor], Callable[[Tensor], Tensor]] | None


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def equal_bits() -> Scheme:
    def weight(w: Tensor) -> Tensor:
        return exact.fixed_point(w, exact.bits_for(w.shape[-1]))

    def linear(x: Tensor, w: Tensor) -> Tensor:
        return exact.matmul(exact.fixed_point(x, exact.bits_for(x.shape[-1])), w)

    return linear, weight


def fixed_uneven() -> Scheme:
    def weight(w: Tensor) -> Tensor:
        return exact.fixed_point(w, math.floor(53 - math.log2(w.shape[-1])) - 24)

    def linear(x: Tensor, w: Tensor) -> Tensor:
        return exact.matmul(exact.fixed_point(x, 24), w)

    return linear, weight


SCHEMES: dict[str, Callable[[], Scheme]] = {
    "equal (bits_for(K) each)": equal_bits,
    "fixed uneven (24 / the rest)": fixed_uneven,
    "engine (24 or fewer by magnitude / weight_bits(K))": lambda: None,
}


def projection_names(cfg: hf_backend.ModelConfig) -> list[str]:
    names = [name for group in GROUPS.values() for name in group]
    return [f"model.layers.{n}.{name}.weight" for n in range(cfg.num_layers) for name in names]


def with_adapter(weights: dict[str, Tensor], names: list[str], scale: float) -> dict[str, Tensor]:
    """The weights with a random rank-8 update merged into every projection, `scale` times
    the projection's own RMS: full float32 mantissas, like a trained adapter's."""
    gen = torch.Generator().manual_seed(0)
    out = dict(weights)
    for name in names:
        w = weights[name]
        a, b = torch.randn(8, w.shape[1], generator=gen), torch.randn(w.shape[0], 8, generator=gen)
        delta = b @ a
        out[name] = w + delta * (scale * w.pow(2).mean().sqrt() / delta.pow(2).mean().sqrt())
    return out


def max_difference(left: list[Tensor], right: list[Tensor]) -> float:
    return max((a - b).abs().max().item() for a, b in zip(left, right, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gguf/SmolLM2-135M-Instruct-Q4_1")
    parser.add_argument("--adapter-scale", type=float, default=0.05)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    snapshot = hf_cache.snapshot(args.model)
    if snapshot is None:
        raise SystemExit(f"--model: {args.model} is not in the Hugging Face cache")
    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    sequences = []
    for chat in CHATS:
        messages = [{"role": role, "content": content} for role, content in chat]
        ids = tokenizer.apply_chat_template(messages, tokenize=True)
        sequences.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    cfg, base = hf_backend.load(args.model, snapshot)
    names = projection_names(cfg)
    print(f"model {args.model}, {sum(len(s) for s in sequences)} tokens in {len(CHATS)} chats")
    adapted = with_adapter(base, names, args.adapter_scale)
    for label, weights in (("base", base), (f"base + adapter ({args.adapter_scale} RMS)", adapted)):
        log(f"{label}: transformers float32 and float64 forwards ...")
        hf = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
        hf.load_state_dict({k: v for k, v in weights.items() if k in hf.state_dict()}, strict=False)

        def reference(model: torch.nn.Module) -> list[Tensor]:
            rows = []
            for ids in sequences:
                with torch.no_grad():
                    logits = model(torch.tensor([ids[:-1]])).logits[0].double()
                target = torch.tensor(ids[1:])[:, None]
                rows.append(logits.log_softmax(-1).gather(1, target)[:, 0])
            return rows

        float32 = reference(hf)
        truth = reference(hf.double())
        print(f"{label}: transformers float32 against float64 {max_difference(float32, truth):.2e}")
        for scheme, make in SCHEMES.items():
            log(f"{label}: engine, {scheme} ...")
            patches = make()
            context = (
                nullcontext()
                if patches is None
                else mock.patch.multiple(exact, linear=patches[0], weight=patches[1])
            )
            with context, torch.no_grad():
                model = Llama(cfg, weights)
                got = [
                    model.target_logprobs(
                        model.hidden(torch.tensor([ids[:-1]])), torch.tensor([ids[1:]])
                    )[0].double()
                    for ids in sequences
                ]
            print(
                f"{label}, {scheme}: against float64 {max_difference(got, truth):.2e}, "
                f"against float32 {max_difference(got, float32):.2e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
