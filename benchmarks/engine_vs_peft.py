"""The engine (`EngineRun` in-process) against what a user would run instead, transformers +
PEFT (LoRA r8 on q,k,v,o,gate,up,down, the same base weights, the same tokens), side by side in
alternating worker processes: forward, forward_backward (cross_entropy, and RL-shaped datums
whose first half, the prompt, weighs 0), a train step (cross_entropy forward_backward then an
AdamW step, so the engine's next forward rebuilds its merged weights), logprobs, and sample (a
group of samples of one prompt, and several prompts, `--new-tokens` each), the engine with its
compiled kernels and eager (`WHITNEY_ENGINE_COMPILE=1` and `0`, `--compile 1,0`). Prints each
median, the engine/PEFT ratio (compiled, then eager), tokens per second and the achieved GFLOPS
against the machine's float32 (and float64) matmul rate, measured first, and beside each of
the issue's aims the floor of exact arithmetic on this machine: a forward's float64 products
(plus PEFT's own backward for a forward_backward), and for a group's samples those of its
decode steps, timed here at the model's shapes. Then, on local/tiny, a cycle against the engine
before it was exact (`benchmarks/engine_cycle.py`).

    python benchmarks/engine_vs_peft.py [--model gguf/SmolLM2-135M-Instruct-Q4_1]
        [--hf-cache /work/models/hf-cache] [--threads 2] [--rounds 2] [--reps 1]
        [--shapes 16x43,4x256] [--work forward,...,sample_batch] [--samples 8]
        [--new-tokens 64] [--memory 16x1024]
        [--tiny-cycles 5] [--tiny-rounds 2] [--skip-tiny] [--compile 1,0]

`--work` picks some of the workloads (comma-separated: the names above, `sample_group`,
`sample_batch`), for a shorter run. `--memory BxT` adds one engine forward_backward of that
shape in a worker of its own and reports its peak resident memory.

What it measured, and on what machine: docs/engine.md and docs/measured.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from whitney.errors import UnsupportedBaseModel
from whitney.local.model_pull import PULLABLE

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STORY = "Write a long, detailed story about a lighthouse keeper and a storm, in plain prose."
WORK = ("forward", "forward_backward", "forward_backward_rl", "train_step", "logprobs")
AIMS = {"forward_backward": 1.2, "forward_backward_rl": 1.2, "logprobs": 1.5, "sample group": 0.75}
"""Issue 39's aims, engine / PEFT (lower is faster); forward_backward also within 1.05x of its
floor, a group's samples within 1.1x of its floor where the floor is above the aim."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def shapes_of(text: str) -> list[tuple[int, int]]:
    return [(int(b), int(t)) for b, t in (part.split("x") for part in text.split(",") if part)]


def token_batch(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """`batch` sequences of `length + 1` token ids (inputs and shifted targets)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length + 1), generator=generator).tolist()


def rl_weights(length: int) -> list[float]:
    """An RL datum's weights: its first half (the prompt) weighs 0, the completion 1."""
    return [0.0] * (length // 2) + [1.0] * (length - length // 2)


def matmul_rates(threads: int) -> dict[str, float]:
    """GFLOPS of a 2048^3 float32 and float64 matmul on `threads` threads (best of 5)."""
    import torch

    torch.set_num_threads(threads)
    rates = {}
    for dtype in (torch.float32, torch.float64):
        a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
        a @ b
        best = min(timed(lambda a=a, b=b: a @ b) for _ in range(5))
        rates[str(dtype).removeprefix("torch.")] = 2 * 2048**3 / best / 1e9
    return rates


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --- workers --------------------------------------------------------------------------------


class EngineSide:
    """The workloads on the engine: `EngineRun` in-process, a sampler of its current adapter."""

    def __init__(self, args: argparse.Namespace) -> None:
        from whitney.local.engine import EngineRun, kernels

        t0 = time.perf_counter()  # the compiled kernels, waited for: timed work runs them
        self.compiled = kernels.STATE.wait()
        self.compile_s = time.perf_counter() - t0
        log(f"    engine: kernels compiled {self.compiled} in {self.compile_s:.1f} s")
        cache = Path(args.hf_cache) if args.hf_cache else None
        self.run = EngineRun.create(base_model=args.model, lora_rank=8, seed=0, hf_cache=cache)
        self.run.save_weights_for_sampler("bench")
        self.vocab = self.run.cfg.vocab_size

    def payload(self, batch: list[list[int]], rl: bool) -> dict:
        data = []
        for tokens in batch:
            n = len(tokens) - 1
            inputs: dict = {"target_tokens": {"dtype": "int64", "shape": [n], "values": tokens[1:]}}
            if rl:
                weights = rl_weights(n)
                inputs["weights"] = {"dtype": "float32", "shape": [n], "values": weights}
                inputs["logprobs"] = {"dtype": "float32", "shape": [n], "values": [-9.0] * n}
                inputs["advantages"] = {"dtype": "float32", "shape": [n], "values": weights}
            data.append({"input": {"token_ids": tokens[:-1]}, "loss_inputs": inputs})
        loss = "importance_sampling" if rl else "cross_entropy"
        return {"data": data, "loss_function": loss}

    def work(self, kind: str, batch: list[list[int]]) -> None:
        if kind == "logprobs":
            self.run.logprobs("bench", {"sequences": [{"token_ids": t} for t in batch]})
            return
        payload = self.payload(batch, rl=kind == "forward_backward_rl")
        self.run.forward(payload, backward=kind != "forward")
        if kind == "train_step":  # the adapter changes: the next forward rebuilds its weights
            self.run.optim_step({"type": "adamw", "learning_rate": 1e-6})

    def sample(self, prompts: list[list[int]], samples: int, new_tokens: int) -> int:
        params = {"max_tokens": new_tokens, "temperature": 1.0, "seed": 1}
        requests = [
            {"prompt": {"token_ids": p}, "num_samples": samples, "sampling_params": params}
            for p in prompts
        ]
        outs = self.run.sample("bench", requests, [0] * len(prompts))
        return sum(len(s["tokens"]) for out in outs for s in out.result["sequences"])


class PeftSide:
    """The same workloads on transformers + PEFT, as a user would write them."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        from whitney.local.engine import hf_backend

        cache = Path(args.hf_cache) if args.hf_cache else None
        directory = hf_backend.source_directory(args.model, cache)
        base = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS)
        self.model = get_peft_model(base, config)
        self.vocab = base.config.vocab_size
        self.eos = base.config.eos_token_id
        self.torch = torch
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=1e-6, weight_decay=0.0)

    def logprobs_of(self, ids, targets):
        logits = self.model(input_ids=ids).logits.float()
        return logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    def work(self, kind: str, batch: list[list[int]]) -> None:
        torch = self.torch
        tokens = torch.tensor(batch)
        ids, targets = tokens[:, :-1], tokens[:, 1:]
        if kind in ("forward", "logprobs"):
            with torch.inference_mode():
                lp = self.logprobs_of(ids, targets)
                (-lp.mean()).item()
            return
        self.model.train()
        lp = self.logprobs_of(ids, targets)
        if kind == "forward_backward_rl":
            weights = torch.tensor(rl_weights(ids.shape[1])).expand_as(lp)
            ratio = torch.exp(lp - -9.0)
            loss = -(ratio * weights * weights).sum()
        else:
            loss = -lp.sum()
        loss.backward()
        if kind == "train_step":
            self.optimizer.step()
        self.model.zero_grad(set_to_none=True)

    def sample(self, prompts: list[list[int]], samples: int, new_tokens: int) -> int:
        torch = self.torch
        produced = 0
        with torch.inference_mode():
            for prompt in prompts:  # one generate per prompt, its group as return sequences
                out = self.model.generate(
                    input_ids=torch.tensor([prompt]),
                    attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=new_tokens,
                    num_return_sequences=samples,
                    pad_token_id=self.eos,
                )
                new = out[:, len(prompt) :]
                ended = (new == self.eos).int().cumsum(-1)
                produced += int(((ended == 0) | ((ended == 1) & (new == self.eos))).sum())
        return produced


def prompt_ids(args: argparse.Namespace, count: int) -> list[list[int]]:
    """`count` chat prompts of the story request (token ids from the checkpoint's tokenizer)."""
    from transformers import AutoTokenizer

    from whitney.local.engine import hf_backend

    cache = Path(args.hf_cache) if args.hf_cache else None
    tokenizer = AutoTokenizer.from_pretrained(hf_backend.source_directory(args.model, cache))
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{STORY} Story number {i + 1}."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(count)
    ]


def worker(args: argparse.Namespace) -> dict:
    """Time every workload on one side (after one warm-up each); report seconds and peak RSS."""
    import torch

    torch.set_num_threads(args.threads)
    side = EngineSide(args) if args.worker == "engine" else PeftSide(args)
    times: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    if args.memory_only:
        (b, t), kind = shapes_of(args.memory)[0], "forward_backward"
        side.work(kind, token_batch(b, t, side.vocab, seed=1))
        return {"rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    for b, t in shapes_of(args.shapes):
        batch = token_batch(b, t, side.vocab, seed=b * 1000 + t)
        for kind in (k for k in WORK if k in args.work):
            key = f"{kind} {b}x{t}"
            for rep in range(args.reps + 1):
                seconds = timed(lambda kind=kind, batch=batch: side.work(kind, batch))
                if rep:
                    times.setdefault(key, []).append(seconds)
                label = f"rep {rep}" if rep else "warm-up"
                log(f"    {args.worker}: {key} {label} {seconds:.2f} s")
    for name, prompts, samples in (
        ("sample group", 1, args.samples),
        ("sample batch", 4, max(1, args.samples // 2)),
    ):
        if name.replace(" ", "_") not in args.work:
            continue
        ids = prompt_ids(args, prompts)
        key = f"{name} {prompts}x{samples}x{args.new_tokens}"
        for rep in range(args.reps + 1):
            t0 = time.perf_counter()
            produced = side.sample(ids, samples, args.new_tokens)
            seconds = time.perf_counter() - t0
            if rep:
                times.setdefault(key, []).append(seconds)
                counts[key] = counts.get(key, 0) + produced
            log(f"    {args.worker}: {key} ({produced} tokens) {seconds:.2f} s")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    compiled = (
        {"compiled": side.compiled, "compile_s": side.compile_s} if args.worker == "engine" else {}
    )
    return {"times": times, "sampled": counts, "rss_gib": rss} | compiled


# --- the side-by-side run -------------------------------------------------------------------


def spawn(args: argparse.Namespace, side: str, extra: list[str] = ()) -> dict:
    """A worker of `side`: "peft", "engine" (compiled kernels) or "eager" (the engine without)."""
    compiled = "0" if side == "eager" else "1"
    command = [sys.executable, __file__, "--worker", "peft" if side == "peft" else "engine", *extra]
    for name in ("model", "hf_cache", "threads", "reps", "shapes", "samples", "new_tokens", "work"):
        value = getattr(args, name)
        if value is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    if args.memory:
        command += ["--memory", args.memory]
    env = os.environ | {"PYTHONPATH": str(ROOT), "WHITNEY_ENGINE_COMPILE": compiled}
    out = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def flops(cfg: dict, kind: str, batch: int, length: int) -> float:
    """Approximate FLOPs: 2 per weight per token, attention's two T x T products per layer;
    a LoRA forward_backward is a forward plus the input gradients (about twice the forward)."""
    h, layers, inter, vocab = cfg["hidden"], cfg["layers"], cfg["inter"], cfg["vocab"]
    heads, kv, d = cfg["heads"], cfg["kv"], cfg["head_dim"]
    per_layer = h * (heads * d + 2 * kv * d) + heads * d * h + 3 * h * inter
    tokens = batch * length
    forward = 2 * tokens * (layers * per_layer + vocab * h) + 4 * batch * length**2 * heads * d
    return forward * (1 if kind in ("forward", "logprobs") else 2)


def weight_products(cfg: dict, rows: int, threads: int, stored: str = "float64") -> float:
    """Seconds of one pass's weight products for `rows` rows in float64, every layer's
    projections and the head at the shapes the engine multiplies (best of 3): what a forward of
    `rows` tokens, or a decode step of `rows` samples, costs the exact engine before any other
    work, at this machine's float64 rate for those shapes. `stored="float32"`: the weights
    stored as float32 and multiplied as the engine does (`products.product`, its compiled kernel
    for a decode step's few rows once loaded)."""
    import torch

    from whitney.local.engine import kernels, products

    torch.set_num_threads(threads)
    h, inter, vocab = cfg["hidden"], cfg["inter"], cfg["vocab"]
    q, kv = cfg["heads"] * cfg["head_dim"], cfg["kv"] * cfg["head_dim"]
    shapes = [(q + 2 * kv, h), (h, q), (2 * inter, h), (h, inter)] * cfg["layers"]
    dtype = getattr(torch, stored)
    weights = [torch.randn(n, k, dtype=dtype) for n, k in [*shapes, (vocab, h)]]
    inputs = {k: torch.randn(rows, k, dtype=torch.float64) for _, k in shapes}
    if stored == "float32":
        kernels.STATE.wait()

    def one_pass() -> None:
        for w in weights:
            if stored == "float32":
                products.product(inputs[w.shape[1]], w)
            else:
                inputs[w.shape[1]] @ w.T

    one_pass()
    return min(timed(one_pass) for _ in range(3))


def forward_products(cfg: dict, batch: int, length: int, threads: int, rates: dict) -> float:
    """Seconds of a forward's float64 products at `batch` x `length` tokens: its weight products
    timed at their shapes, and attention's two products per layer at the float64 rate."""
    attention = 4 * batch * length**2 * cfg["heads"] * cfg["head_dim"] * cfg["layers"]
    return weight_products(cfg, batch * length, threads) + attention / rates["float64"] / 1e9


def floor_ratio(kind: str, peft: dict[str, float], forward_seconds: float) -> float:
    """The exact engine's least time over PEFT's for `kind` at one shape: the forward's float64
    products, plus PEFT's own time beyond its forward (its backward, its step)."""
    beyond = 0.0 if kind in ("forward", "logprobs") else peft[kind] - peft["forward"]
    return (forward_seconds + beyond) / peft[kind]


def model_shape(args: argparse.Namespace) -> dict:
    from whitney.local.engine.runtime import base_key, load_base

    cache = Path(args.hf_cache) if args.hf_cache else None
    cfg, _ = load_base(args.model, base_key(args.model, cache))
    return {
        "hidden": cfg.hidden_size,
        "layers": cfg.num_layers,
        "inter": cfg.intermediate_size,
        "vocab": cfg.vocab_size,
        "heads": cfg.num_heads,
        "kv": cfg.kv_heads,
        "head_dim": cfg.dim_head,
    }


def report(args: argparse.Namespace, found: dict, rates: dict, cfg: dict) -> None:
    engine, peft = found[engines(args)[0]], found["peft"]
    medians = {
        side: {k: statistics.median(v) for k, v in found[side]["times"].items()} for side in found
    }
    eager = medians.get("eager") if "engine" in medians else None
    print(
        f"\n  {'work':34s} {'engine s':>9s} {'PEFT s':>9s} {'ratio':>6s} {'aim':>5s} {'floor':>6s}"
        + (f" {'eager s':>8s} {'ratio':>6s}" if eager else "")
        + "   engine / PEFT (floor: exact float64 arithmetic's least ratio on this machine)"
    )
    products: dict[str, float] = {}  # a shape's forward products, timed once
    floors_f32: list[str] = []  # a group's floor with the engine's float32-stored weights
    for key, new in medians[engines(args)[0]].items():
        old = medians["peft"][key]
        slow = medians["eager"][key] if eager else 0.0
        kind, shape = key.rsplit(" ", 1)
        aim = f"{AIMS[kind]:.2f}x" if kind in AIMS else ""
        if kind.startswith("sample"):
            made_new, made_old = engine["sampled"][key], peft["sampled"][key]
            n = len(engine["times"][key])
            per_new, per_old = new / (made_new / n), old / (made_old / n)
            floor = ""
            if kind == "sample group":
                rows = int(shape.split("x")[1])
                floor = f"{weight_products(cfg, rows, args.threads) / rows / per_old:5.2f}x"
                narrow = weight_products(cfg, rows, args.threads, "float32") / rows / per_old
                floors_f32.append(f"{key}: {narrow:.2f}x")
            beside = ""
            if eager:
                per_slow = slow / (found["eager"]["sampled"][key] / n)
                beside = f" {slow:8.2f} {per_slow / per_old:5.2f}x"
            print(
                f"  {key:34s} {new:9.2f} {old:9.2f} {per_new / per_old:5.2f}x {aim:>5s} {floor:>6s}"
                f"{beside}   {made_new / n / new:.0f} / {made_old / n / old:.0f} sampled tokens/s"
                " (ratios per token)"
            )
            continue
        b, t = (int(x) for x in shape.split("x"))
        work = flops(cfg, kind, b, t)
        at_shape = (k.rsplit(" ", 1) for k in medians["peft"])
        peft_here = {w: medians["peft"][f"{w} {s}"] for w, s in at_shape if s == shape}
        if shape not in products:
            products[shape] = forward_products(cfg, b, t, args.threads, rates)
        floor = floor_ratio(kind, peft_here, products[shape])
        gf_new, gf_old = work / new / 1e9, work / old / 1e9
        beside = f" {slow:8.2f} {slow / old:5.2f}x" if eager else ""
        print(
            f"  {key:34s} {new:9.2f} {old:9.2f} {new / old:5.2f}x {aim:>5s} {floor:5.2f}x{beside}"
            f"   {b * t / new:.0f} / {b * t / old:.0f} tokens/s, {gf_new:.0f} / {gf_old:.0f} "
            f"GFLOPS ({gf_new / rates['float32']:.0%} / {gf_old / rates['float32']:.0%} of float32)"
        )
    for line in floors_f32:
        print(f"  floor with float32-stored weights (the engine's small product), {line}")
    rss_new = max(engine["rss_gib"])
    rss_old = max(peft["rss_gib"])
    print(f"  peak resident memory of a worker: engine {rss_new:.2f} GiB, PEFT {rss_old:.2f} GiB")


def engines(args: argparse.Namespace) -> list[str]:
    """The engine's sides in this run: "engine" (compiled kernels) and/or "eager"."""
    return ["engine" if setting == "1" else "eager" for setting in args.compile.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=PULLABLE["smollm2-135m-instruct"].repo_id)
    parser.add_argument("--hf-cache", default=os.environ.get("HF_HUB_CACHE"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="alternating pairs of workers")
    parser.add_argument("--reps", type=int, default=1, help="timed runs per worker and work")
    parser.add_argument("--shapes", default="16x43,4x256", help="datums x tokens, comma-separated")
    parser.add_argument("--work", default=",".join([*WORK, "sample_group", "sample_batch"]))
    parser.add_argument("--samples", type=int, default=8, help="samples of the one-prompt group")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--memory", default=None, metavar="BxT", help="peak RSS of one such fb")
    parser.add_argument("--tiny-cycles", type=int, default=5)
    parser.add_argument("--tiny-rounds", type=int, default=2)
    parser.add_argument("--skip-tiny", action="store_true")
    parser.add_argument(
        "--compile",
        default="1,0",
        help="the engine's WHITNEY_ENGINE_COMPILE settings, side by side",
    )
    parser.add_argument("--worker", choices=("engine", "peft"), help=argparse.SUPPRESS)
    parser.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    rates = matmul_rates(args.threads)
    print(
        f"matmul 2048^3 on {args.threads} threads: float32 {rates['float32']:.0f} GFLOPS, "
        f"float64 {rates['float64']:.0f} GFLOPS; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    try:
        cfg = model_shape(args)
    except UnsupportedBaseModel as error:
        pull = "whitney-flows models pull smollm2-135m-instruct"
        raise SystemExit(f"{error}; `{pull}` brings it") from None
    print(f"{args.model}: {cfg}; shapes {args.shapes}, {args.rounds} rounds", flush=True)
    sides = ["peft", *engines(args)]
    found: dict[str, dict] = {side: {} for side in sides}
    for n in range(args.rounds):
        order = sides if n % 2 == 0 else sides[::-1]
        for side in order:
            result = spawn(args, side)
            for key, values in result["times"].items():
                found[side].setdefault("times", {}).setdefault(key, []).extend(values)
            for key, value in result["sampled"].items():
                sampled = found[side].setdefault("sampled", {})
                sampled[key] = sampled.get(key, 0) + value
            found[side].setdefault("rss_gib", []).append(result["rss_gib"])
            if "compiled" in result:
                print(
                    f"  {side} worker: compiled kernels {result['compiled']}, ready after "
                    f"{result['compile_s']:.1f} s",
                    flush=True,
                )
            print(
                f"  round {n + 1}/{args.rounds}: {side} done, load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    report(args, found, rates, cfg)
    if args.memory:  # the engine only: PEFT's logits alone at 16x1024 are 3 GiB, a copy each step
        rss = spawn(args, engines(args)[0], ["--memory-only"])["rss_gib"]
        print(f"  forward_backward {args.memory} peak RSS, engine: {rss:.2f} GiB", flush=True)
    if not args.skip_tiny:
        print("\nlocal/tiny: an RL cycle against the engine before it was exact", flush=True)
        command = [sys.executable, str(ROOT / "benchmarks" / "engine_cycle.py")]
        command += ["--cycles", str(args.tiny_cycles), "--rounds", str(args.tiny_rounds)]
        command += ["--threads", str(args.threads)]
        subprocess.run(command, check=True, env=os.environ | {"PYTHONPATH": str(ROOT)})


if __name__ == "__main__":
    main()
