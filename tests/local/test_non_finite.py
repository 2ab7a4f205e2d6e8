"""Non-finite numbers never pass (issue 13): an operation that would produce one fails with
error type `non_finite`, every answer is strict JSON, the run stays `ready`, and later
operations give bit for bit what a run (same seed) that never got the failed one gives."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from whitney.errors import NonFiniteResult
from whitney.local import EmbeddedWhitney
from whitney.local.journal import fast_json

from .helpers import adamw, datum, forward, new_run, sample_request, submit_op

PROMPT, COMPLETION = list(b"Q: "), list(b"the answer")
HUGE_ADVANTAGE = 3e38  # finite in float32
SEED = 11


def refuse_constant(token: str) -> Any:
    raise ValueError(f"not JSON: {token}")


def strict_json(text: str) -> Any:
    """`text` parsed as JSON proper: NaN, Infinity and -Infinity are refused."""
    return json.loads(text, parse_constant=refuse_constant)


def submit(
    api: httpx.Client, run_id: str, seq_id: int, kind: str, payload: dict, sampler=None
) -> dict:
    """Submit and wait until terminal; both answers must be strict JSON."""
    return submit_op(api, run_id, seq_id, kind, payload, sampler, parse=strict_json)


def ok(api: httpx.Client, run_id: str, seq_id: int, kind: str, payload: dict, sampler=None):
    """The result of an operation that must succeed."""
    op = submit(api, run_id, seq_id, kind, payload, sampler)
    assert op["status"] == "succeeded", op
    return op["result"]


def refused(
    api: httpx.Client, run_id: str, seq_id: int, kind: str, payload: dict, sampler=None
) -> dict:
    """The error of an operation that must fail `non_finite`, on a run that stays ready."""
    op = submit(api, run_id, seq_id, kind, payload, sampler)
    assert op["status"] == "failed", op
    assert op["result"] is None
    assert op["error"]["type"] == "non_finite", op["error"]
    run = api.get(f"/v1/training/runs/{run_id}")
    assert strict_json(run.text)["status"] == "ready"
    return op["error"]


def listing_is_strict_json(api: httpx.Client, run_id: str) -> list[dict]:
    response = api.get(f"/v1/training/runs/{run_id}/operations")
    assert response.status_code == 200, response.text
    operations = strict_json(response.text)["operations"]
    assert operations
    return operations


def good() -> dict:
    return forward([datum(PROMPT, COMPLETION)], "cross_entropy")


def rl(loss: str, completion: list[int], advantage: float, logprob: float) -> dict:
    n = len(completion)
    one = datum(PROMPT, completion, advantages=[advantage] * n, logprobs=[logprob] * n)
    return forward([one], loss)


def pair(api: httpx.Client) -> tuple[str, str]:
    """Two fresh local/nano runs with the same seed: the first gets the bad operations."""
    return (
        new_run(api, lora_rank=4, seed=SEED)["run_id"],
        new_run(api, lora_rank=4, seed=SEED)["run_id"],
    )


def test_the_premises_overflow_float32():
    """What the bad operations rely on, computed independently."""
    with np.errstate(over="ignore", divide="ignore"):
        assert np.isfinite(np.float32(HUGE_ADVANTAGE))
        assert not np.isfinite(np.float32(math.exp(20.0) * HUGE_ADVANTAGE))  # ratio clamp e^20
        assert np.float32(1e-300) == 0  # eps 1e-300: A's zero moments give 0 / (0 + 0)


@pytest.mark.parametrize("loss", ["importance_sampling", "ppo"])
def test_a_forward_backward_whose_loss_overflows_fails_and_leaves_the_gradients(api, loss):
    bad, clean = pair(api)
    overflow = rl(loss, COMPLETION, HUGE_ADVANTAGE, -100.0)  # ratio e^20 times 3e38
    ok(api, bad, 1, "forward_backward", good())
    error = refused(api, bad, 2, "forward_backward", overflow)
    assert error["details"] == {"quantity": "loss"}
    assert refused(api, bad, 3, "forward", overflow)["details"] == {"quantity": "loss"}
    ok(api, bad, 4, "optim_step", adamw(1e-2))
    after = ok(api, bad, 5, "forward", good())

    ok(api, clean, 1, "forward_backward", good())
    ok(api, clean, 2, "optim_step", adamw(1e-2))
    assert ok(api, clean, 3, "forward", good()) == after
    listing_is_strict_json(api, bad)


def test_a_forward_backward_whose_gradients_overflow_restores_the_earlier_ones(api):
    """One token of advantage 3e38: the loss is finite, its gradient is not."""
    bad, clean = pair(api)
    overflow = rl("importance_sampling", COMPLETION[:1], HUGE_ADVANTAGE, -1.0)
    ok(api, bad, 1, "forward_backward", good())
    error = refused(api, bad, 2, "forward_backward", overflow)
    assert error["details"] == {"quantity": "gradients"}
    finite_loss = ok(api, bad, 3, "forward", overflow)["loss"]
    assert math.isfinite(finite_loss) and finite_loss < -1e35
    ok(api, bad, 4, "optim_step", adamw(1e-2))
    after = ok(api, bad, 5, "forward", good())

    ok(api, clean, 1, "forward_backward", good())
    ok(api, clean, 2, "optim_step", adamw(1e-2))
    assert ok(api, clean, 3, "forward", good()) == after


def test_an_optim_step_of_zero_over_zero_restores_weights_moments_and_step(api):
    """eps 1e-300 (0 in float32) and LoRA A's first gradient 0 (B starts at 0): 0 / 0."""
    bad, clean = pair(api)
    ok(api, bad, 1, "forward_backward", good())
    error = refused(api, bad, 2, "optim_step", adamw(1e-2, eps=1e-300))
    assert error["details"] == {"quantity": "parameters, optimizer moments or grad norm"}
    assert strict_json(api.get(f"/v1/training/runs/{bad}").text)["step"] == 0
    assert ok(api, bad, 3, "optim_step", adamw(1e-2))["step"] == 1  # the gradients are kept
    ok(api, bad, 4, "forward_backward", good())
    assert ok(api, bad, 5, "optim_step", adamw(1e-2))["step"] == 2  # t and moments as before
    after = ok(api, bad, 6, "forward", good())

    ok(api, clean, 1, "forward_backward", good())
    ok(api, clean, 2, "optim_step", adamw(1e-2))
    ok(api, clean, 3, "forward_backward", good())
    ok(api, clean, 4, "optim_step", adamw(1e-2))
    assert ok(api, clean, 5, "forward", good()) == after
    assert strict_json(api.get(f"/v1/training/runs/{bad}").text)["step"] == 2
    listing_is_strict_json(api, bad)


def tamper(server: EmbeddedWhitney, run_id: str, name: str, value: float) -> None:
    """Set every adapter weight of the run's checkpoint `name`, on disk, to `value`."""
    path = Path(server.data_dir) / "runs" / run_id / "states" / name / "adapter.safetensors"
    adapter = load_file(path)
    save_file({key: torch.full_like(t, value) for key, t in adapter.items()}, path)


def test_sample_and_logprobs_with_non_finite_logprobs_fail_and_change_nothing(api, embedded_server):
    """Adapter weights of 1e30 (finite; loaded from a checkpoint changed on disk, as no
    accepted optim_step can make them) overflow the sampler's attention scores."""
    bad, clean = pair(api)
    sequences = {"sequences": [{"token_ids": PROMPT + COMPLETION}]}
    request = sample_request(PROMPT, 3, 8, seed=5)
    ok(api, bad, 1, "save_weights_for_sampler", {"name": "s0"})
    ok(api, bad, 2, "save_state", {"name": "huge"})
    tamper(embedded_server, bad, "huge", 1e30)
    ok(api, bad, 3, "load_state", {"checkpoint": f"whitney://runs/{bad}/states/huge"})
    ok(api, bad, 4, "save_weights_for_sampler", {"name": "s1"})
    refused(api, bad, 5, "logprobs", sequences, "s1")
    refused(api, bad, 6, "sample", request, "s1")
    sampled = ok(api, bad, 7, "sample", request, "s0")
    logprobs = ok(api, bad, 8, "logprobs", sequences, "s0")

    ok(api, clean, 1, "save_weights_for_sampler", {"name": "s0"})
    assert ok(api, clean, 2, "sample", request, "s0") == sampled
    assert ok(api, clean, 3, "logprobs", sequences, "s0") == logprobs
    statuses = [op["status"] for op in listing_is_strict_json(api, bad)]
    assert statuses == ["succeeded"] * 4 + ["failed"] * 2 + ["succeeded"] * 2


def test_a_checkpoint_holding_infinity_is_refused_by_load_state(api, embedded_server):
    bad, clean = pair(api)
    ok(api, bad, 1, "save_state", {"name": "inf"})
    tamper(embedded_server, bad, "inf", math.inf)
    error = refused(api, bad, 2, "load_state", {"checkpoint": f"whitney://runs/{bad}/states/inf"})
    assert error["details"] == {"quantity": "checkpoint weights or moments"}
    assert ok(api, bad, 3, "forward", good()) == ok(api, clean, 1, "forward", good())


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_the_journal_refuses_to_write_a_non_finite_number(number):
    with pytest.raises(NonFiniteResult):
        fast_json({"loss": 1.0, "outputs": [{"logprobs": [-0.5, number]}]})


def test_the_journal_writes_nan_and_infinity_inside_strings():
    value = {"sampler_id": "NaN, Infinity", "logprobs": [-1.5, 0.0]}
    assert strict_json(fast_json(value)) == value
