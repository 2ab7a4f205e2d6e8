"""Helpers of the distillation tests: a small config, a teacher checkpoint made with the
client, and what the server's journal says about concurrency."""

from __future__ import annotations

import random
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from flows.distill.config import DistillationConfig
from flows.sft.config import SFTConfig
from flows.sft.corpus import builtin_examples
from flows.sft.plan import example_tokens, held_out
from tasks.retry import TaskRetrySettings
from whitney import wire
from whitney.client import WhitneyClient
from whitney.datums import sft_datum
from whitney.payloads import adamw_optimizer, forward_backward_payload
from whitney.renderers import get_renderer
from whitney.tokenizers import get_tokenizer


def small_distill_config(api_url: str, **settings: object) -> DistillationConfig:
    """A fast distillation on local/nano (2 prompts x 2 samples x 8 tokens a cycle), with
    `settings` on top."""
    defaults: dict[str, object] = {
        "api_url": api_url,
        "base_model": "local/nano",
        "prompts_per_cycle": 2,
        "group_size": 2,
        "max_tokens": 8,
        "teacher_chunk_size": 2,
        "task_retry": TaskRetrySettings(retries=2, delay_s=0.05, max_delay_s=0.2, jitter=0.1),
    }
    return DistillationConfig.model_validate({**defaults, **settings})


def small_sft_teacher(steps: int) -> SFTConfig:
    """An SFT teacher of `steps` steps of 4 pairs, in one cycle, with no eval split."""
    return SFTConfig(
        steps=steps, steps_per_cycle=steps, batch_size=4, warmup_steps=1, eval_fraction=0.0
    )


def make_teacher_checkpoint(
    client: WhitneyClient,
    base_model: str = "local/nano",
    steps: int = 30,
    learning_rate: float = 1e-2,
    seed: int = 0,
) -> str:
    """A teacher: `steps` cross_entropy steps on the built-in corpus's training split, then
    save_state; its checkpoint URI. Every operation is submitted at once with explicit seq ids
    (the server runs them in order), so a slow server costs one round trip, not 2 * steps."""
    renderer = get_renderer("raw", get_tokenizer(base_model), base_model)
    examples = builtin_examples()
    evaluated = held_out(examples, 0.1)
    train = [example for index, example in enumerate(examples) if index not in evaluated]
    session = client.open_session({"purpose": "distillation-test-teacher"})
    run = client.create_run(session.session_id, "local", base_model, lora_rank=8, seed=seed)
    rng = random.Random(seed)
    calls: list[tuple[str, dict]] = []
    for _ in range(steps):
        data = [sft_datum(*example_tokens(renderer, e)) for e in rng.sample(train, 16)]
        calls.append(("forward_backward", forward_backward_payload(data, "cross_entropy")))
        calls.append(("optim_step", {"optimizer": adamw_optimizer(learning_rate)}))
    calls.append(("save_state", {"name": "teacher"}))
    start = run.next_seq_id
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [
            pool.submit(client.execute, run.run_id, kind, payload, seq_id=start + index)
            for index, (kind, payload) in enumerate(calls)
        ]
        operations = [future.result() for future in futures]
    client.finish(run.run_id)
    client.close_session(session.session_id)
    return operations[-1].result["checkpoint"]


def _timestamp(value: str | None) -> float:
    assert value is not None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def max_in_flight(operations: Iterable[wire.Operation], latency_s: float) -> int:
    """The most operations in flight at once, by the server's records: each from being
    journaled (submitted_at) until its answer could have reached the client (finished_at plus
    the server's added latency). A client that waits for each answer before sending the next
    operation never has two in flight."""
    events = []
    for operation in operations:
        events.append((_timestamp(operation.submitted_at), 1))
        events.append((_timestamp(operation.finished_at) + latency_s, -1))
    in_flight = most = 0
    for _, change in sorted(events):  # at a tie an answer (-1) comes before a submission (+1)
        in_flight += change
        most = max(most, in_flight)
    return most


def recorded_span_s(operations: Iterable[wire.Operation]) -> float:
    """Seconds from the first operation journaled to the last one finished, on the server."""
    operations = list(operations)
    return max(_timestamp(op.finished_at) for op in operations) - min(
        _timestamp(op.submitted_at) for op in operations
    )
