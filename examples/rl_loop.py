"""The RL loop of Whitney's Loop building blocks page, whole, in one file: no Prefect.

Each cycle publishes a sampler, samples a group of completions per prompt, rewards each
(1 for a number, else half its share of digits: the `digits` idea), turns the rewards into
GRPO advantages and `rl_datum`s, and trains with `importance_sampling` (forward_backward,
optim_step). At the end: save_state, export_lora, the adapter downloaded, finish, close.
The helpers are the SDK's, the ones the flows use (`whitney.datums`, `whitney.advantages`,
`whitney.payloads`, `whitney.renderers`).

    python examples/rl_loop.py                      # on an embedded server it starts (CPU)
    python examples/rl_loop.py --cycles 12 --out adapters
    WHITNEY_API_URL=https://... WHITNEY_API_KEY=... python examples/rl_loop.py

It prints one line per cycle (reward, loss, grad norm, seconds) and the adapter's path.
The whole pipeline, with retries, checkpoints and resume, is `whitney-flows run rl`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from whitney.advantages import all_zero, group_mean_advantages
from whitney.client import WhitneyClient
from whitney.datums import Datum, rl_datum
from whitney.errors import TransportError, Unauthorized, WhitneyError
from whitney.local import ServerStartError
from whitney.payloads import (
    adamw_optimizer,
    forward_backward_payload,
    result_sampler_id,
    sample_request,
)
from whitney.renderers import Renderer, get_renderer
from whitney.tokenizers import get_tokenizer

PROMPTS = ("Number: ", "n=", "Digits: ", "Count: ", "x = ", "Answer: ")
DIGITS = frozenset("0123456789")


def reward(completion: str) -> float:
    """1.0 for a decimal number, else half the share of its characters that are digits."""
    share = sum(c in DIGITS for c in completion) / len(completion) if completion else 0.0
    return 1.0 if share == 1.0 else 0.5 * share


def build_loss(sample: dict, request: dict, renderer: Renderer) -> tuple[list[Datum], list[float]]:
    """The page's `build_loss` for one group: its datums (none when the rewards are all
    equal: no signal) and its rewards."""
    sequences = sample["sequences"]
    rewards = [reward(renderer.parse_response(s["tokens"])["content"]) for s in sequences]
    advantages = group_mean_advantages(rewards, normalize_std=True)
    if all_zero(advantages):
        return [], rewards
    prompt = request["prompt"]["token_ids"]
    data = [
        rl_datum(prompt, s["tokens"], s["logprobs"], advantage)
        for s, advantage in zip(sequences, advantages, strict=True)
        if s["tokens"]
    ]
    return data, rewards


@contextlib.contextmanager
def whitney(api_url: str | None) -> Iterator[WhitneyClient]:
    """A client of the Whitney at `api_url`, else of an embedded server started here."""
    if api_url:
        with WhitneyClient(api_url, os.environ.get("WHITNEY_API_KEY")) as client:
            yield client
        return
    from whitney.local import EmbeddedWhitney  # starting it needs the `local` extra (torch)

    with EmbeddedWhitney() as server, WhitneyClient(server.url, server.api_key) as client:
        yield client


def train(client: WhitneyClient, args: argparse.Namespace) -> Path:
    """The loop skeleton; returns the downloaded adapter archive."""
    tokenizer = get_tokenizer(args.base_model)
    renderer = get_renderer("auto", tokenizer, args.base_model)
    session_id = client.open_session({"example": "rl_loop"}).session_id
    run_id = client.create_run(
        session_id, args.provider, args.base_model, lora_rank=8, seed=args.seed
    ).run_id
    try:
        for cycle in range(args.cycles):
            started = time.monotonic()
            sampler = client.run_operation(
                run_id, "save_weights_for_sampler", {"name": f"cycle-{cycle}"}
            )
            sampler_id = result_sampler_id(sampler)
            draw = random.Random(args.seed * 1_000_003 + cycle)
            data: list[Datum] = []
            rewards: list[float] = []
            for group in range(args.prompts):
                prompt = renderer.build_generation_prompt(
                    [{"role": "user", "content": draw.choice(PROMPTS)}]
                )
                request = sample_request(
                    prompt,
                    args.group_size,
                    max_tokens=args.max_tokens,
                    stop_token_ids=list(renderer.stop_tokens),
                    seed=args.seed * 1_000_003 + cycle * 1_000 + group,
                )
                sample = client.sampler_operation(run_id, sampler_id, "sample", request)
                group_data, group_rewards = build_loss(sample, request, renderer)
                data += group_data
                rewards += group_rewards
            line = f"cycle {cycle + 1}/{args.cycles}  reward {statistics.mean(rewards):.3f}"
            if data:  # every group uniform: nothing to learn from this cycle
                payload = forward_backward_payload(data, "importance_sampling")
                backward = client.run_operation(run_id, "forward_backward", payload)
                optimizer = {"optimizer": adamw_optimizer(learning_rate=args.learning_rate)}
                step = client.run_operation(run_id, "optim_step", optimizer)
                grad_norm = step.get("metrics", {}).get("grad_norm", float("nan"))
                line += f"  loss {backward['loss']:.4f}  grad_norm {grad_norm:.3f}"
            print(f"{line}  {time.monotonic() - started:.1f} s", flush=True)
        state = client.run_operation(run_id, "save_state", {"name": "final"})
        exported = client.run_operation(run_id, "export_lora", {})
        client.finish(run_id)
    except BaseException:  # the page: on failure or interruption, cancel, wait, then close
        with contextlib.suppress(Exception):
            client.cancel(run_id)
            client.wait_terminal(run_id)
        raise
    finally:
        with contextlib.suppress(Exception):
            client.close_session(session_id)
    print(f"checkpoint {state['checkpoint']}", flush=True)
    print(f"adapter sha256 {exported['sha256']}", flush=True)
    archive = args.out / f"{run_id}-{exported['format']}"
    return client.download_artifact(exported["artifact_id"], archive)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20, help="optimizer steps (default 20)")
    parser.add_argument("--prompts", type=int, default=8, help="groups per cycle (default 8)")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt (8)")
    parser.add_argument("--max-tokens", type=int, default=12, help="tokens per sample (12)")
    parser.add_argument("--learning-rate", type=float, default=2e-3, help="AdamW (2e-3)")
    parser.add_argument("--seed", type=int, default=0, help="run and sampling seed (0)")
    parser.add_argument("--base-model", default="local/tiny", help="(default local/tiny)")
    parser.add_argument("--provider", default="local", help="local, modal or tinker (local)")
    parser.add_argument("--out", type=Path, default=Path("adapters"), help="(adapters)")
    parser.add_argument(
        "--api-url",
        default=os.environ.get("WHITNEY_API_URL"),
        help="a Whitney to train on (WHITNEY_API_URL; key: WHITNEY_API_KEY); "
        "none: an embedded server on a free loopback port",
    )
    args = parser.parse_args(argv)
    for name in ("cycles", "prompts", "group_size", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with whitney(args.api_url) as client:
            adapter = train(client, args)
    except (TransportError, Unauthorized) as error:  # the URL or the key: bad input
        print(f"rl_loop.py: --api-url / WHITNEY_API_KEY: {error}", file=sys.stderr)
        return 2
    except (WhitneyError, ServerStartError) as error:
        print(f"rl_loop.py: {error}", file=sys.stderr)
        return 1
    print(f"adapter {adapter}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
