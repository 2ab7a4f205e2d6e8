"""The same training through both fronts on `local/tiny`: supervised steps (two by default), RL
cycles (one: a sampler, two samples, `importance_sampling`, a step), a last forward and the
sampler's prompt logprobs; once through the official `tinker` SDK, once through
`whitney.WhitneyClient` (the tests, and `benchmarks/tinker_front.py`, which times them)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import tinker
from tinker import types

from whitney import WhitneyClient

KEYS = ("tml-tinker-tests-tenant-a", "tinker-tests-tenant-b")
"""Tenant A's key is `tml-`-prefixed as the SDK wants; tenant B's is a plain server key, which
the SDK reaches as `tml-<key>`."""
MAX_BODY_BYTES = 1_000_000
BASE_MODEL = "local/tiny"
RANK = 4
SEED = 3
PROMPT = [5, 9, 12, 40, 17]
SL = [([5, 9, 12, 40], [41, 42, 7]), ([8, 3, 99], [100, 101, 102, 103])]
ADAM = {"learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12}
SAMPLE = {"max_tokens": 4, "seed": 11, "temperature": 1.0}
ADVANTAGES = (1.0, -0.5)


def sdk_key(tenant: int) -> str:
    """The key tenant `tenant` gives the SDK."""
    return KEYS[tenant] if KEYS[tenant].startswith("tml-") else f"tml-{KEYS[tenant]}"


@dataclass
class Trace:
    """What a front answered, as float32 where the engine computes float32."""

    losses: list[float] = field(default_factory=list)
    logprobs: list[list[np.ndarray]] = field(default_factory=list)
    samples: list[tuple[list[int], np.ndarray]] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    prompt_logprobs: list[float | None] = field(default_factory=list)
    run_id: str = ""
    setup_s: float = 0.0
    """Wall time to the first training request: the client, its session and the run."""


def shifted(prompt: list[int], completion: list[int]) -> tuple[list[int], list[int], list[float]]:
    """(input, target_tokens, weights) of a prompt and completion, shifted by one."""
    tokens = prompt + completion
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
    return tokens[:-1], tokens[1:], weights


def rl_rows(samples: list[tuple[list[int], np.ndarray]]) -> list[dict[str, list]]:
    rows = []
    for (tokens, logprobs), advantage in zip(samples, ADVANTAGES, strict=True):
        inputs, targets, weights = shifted(PROMPT, tokens)
        pad = [0.0] * (len(PROMPT) - 1)
        rows.append(
            {
                "input": inputs,
                "target_tokens": targets,
                "logprobs": pad + [float(v) for v in logprobs],
                "advantages": pad + [advantage] * len(tokens),
                "weights": weights,
            }
        )
    return rows


def _tinker_datum(row: dict[str, list]) -> types.Datum:
    inputs = {key: value for key, value in row.items() if key != "input"}
    return types.Datum(model_input=types.ModelInput.from_ints(row["input"]), loss_fn_inputs=inputs)


def sl_rows() -> list[dict[str, list]]:
    rows = []
    for prompt, completion in SL:
        inputs, targets, weights = shifted(prompt, completion)
        rows.append({"input": inputs, "target_tokens": targets, "weights": weights})
    return rows


def stepped_training_client(
    base_url: str, tenant: int
) -> tuple[tinker.ServiceClient, tinker.TrainingClient]:
    """Tenant `tenant`'s SDK service and a training client on BASE_MODEL that has taken one
    cross_entropy forward_backward of the first supervised row (no optimizer step)."""
    service = tinker.ServiceClient(base_url=base_url, api_key=sdk_key(tenant))
    training = service.create_lora_training_client(base_model=BASE_MODEL, rank=RANK).result()
    row = sl_rows()[0]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(row["input"]),
        loss_fn_inputs={"target_tokens": row["target_tokens"]},
    )
    training.forward_backward([datum], "cross_entropy").result()
    return service, training


def through_tinker(base_url: str, api_key: str, sl_steps: int = 2, rl_cycles: int = 1) -> Trace:
    trace = Trace()
    started = time.perf_counter()
    service = tinker.ServiceClient(base_url=base_url, api_key=api_key)
    training = service.create_lora_training_client(
        base_model=BASE_MODEL, rank=RANK, seed=SEED
    ).result()
    trace.run_id = training.model_id
    trace.setup_s = time.perf_counter() - started
    sl = [_tinker_datum(row) for row in sl_rows()]

    def step(data: list[types.Datum], loss: str) -> None:
        result = training.forward_backward(data, loss)
        optim = training.optim_step(types.AdamParams(**ADAM))
        output = result.result()
        trace.losses.append(output.metrics["loss:sum"])
        trace.logprobs.append([np.asarray(o["logprobs"].data) for o in output.loss_fn_outputs])
        trace.grad_norms.append(optim.result().metrics["grad_norm"])

    for _ in range(sl_steps):
        step(sl, "cross_entropy")
    prompt = types.ModelInput.from_ints(PROMPT)
    for _ in range(rl_cycles):
        sampler = training.save_weights_and_get_sampling_client().result()
        answer = sampler.sample(prompt, 2, types.SamplingParams(**SAMPLE)).result()
        trace.samples = [(list(s.tokens), np.asarray(s.logprobs)) for s in answer.sequences]
        step([_tinker_datum(row) for row in rl_rows(trace.samples)], "importance_sampling")
    last = training.forward(sl, "cross_entropy").result()
    trace.losses.append(last.metrics["loss:sum"])
    trace.logprobs.append([np.asarray(o["logprobs"].data) for o in last.loss_fn_outputs])
    after = training.save_weights_and_get_sampling_client().result()
    trace.prompt_logprobs = after.compute_logprobs(prompt).result()
    return trace


def whitney_datum(row: dict[str, list]) -> dict:
    loss_inputs = {}
    for name, values in row.items():
        if name == "input":
            continue
        dtype = "int64" if name == "target_tokens" else "float32"
        loss_inputs[name] = {"dtype": dtype, "shape": [len(values)], "values": values}
    return {"input": {"token_ids": row["input"]}, "loss_inputs": loss_inputs}


def through_whitney(base_url: str, api_key: str, sl_steps: int = 2, rl_cycles: int = 1) -> Trace:
    trace = Trace()
    started = time.perf_counter()
    with WhitneyClient(base_url, api_key) as client:
        session = client.open_session()
        run = client.create_run(
            session.session_id, "tinker", BASE_MODEL, lora_rank=RANK, seed=SEED
        ).run_id
        trace.run_id = run
        trace.setup_s = time.perf_counter() - started
        sl = [whitney_datum(row) for row in sl_rows()]

        def step(data: list[dict], loss: str) -> None:
            payload = {"data": data, "loss_function": loss}
            result = client.run_operation(run, "forward_backward", payload)
            trace.losses.append(result["metrics"]["loss:sum"])
            trace.logprobs.append([np.float32(o["logprobs"]) for o in result["outputs"]])
            optim = client.run_operation(run, "optim_step", {"optimizer": ADAM})
            trace.grad_norms.append(optim["metrics"]["grad_norm"])

        for _ in range(sl_steps):
            step(sl, "cross_entropy")
        request = {"prompt": {"token_ids": PROMPT}, "num_samples": 2, "sampling_params": SAMPLE}
        for _ in range(rl_cycles):
            sampler = client.run_operation(run, "save_weights_for_sampler", {})["sampler_id"]
            answer = client.sampler_operation(run, sampler, "sample", request)
            trace.samples = [(s["tokens"], np.float32(s["logprobs"])) for s in answer["sequences"]]
            step([whitney_datum(row) for row in rl_rows(trace.samples)], "importance_sampling")
        payload = {"data": sl, "loss_function": "cross_entropy"}
        last = client.run_operation(run, "forward", payload)
        trace.losses.append(last["metrics"]["loss:sum"])
        trace.logprobs.append([np.float32(o["logprobs"]) for o in last["outputs"]])
        after = client.run_operation(run, "save_weights_for_sampler", {})["sampler_id"]
        scored = {"sequences": [{"token_ids": PROMPT}]}
        logprobs = client.sampler_operation(run, after, "logprobs", scored)["logprobs"][0]
        trace.prompt_logprobs = [None if v is None else float(np.float32(v)) for v in logprobs]
    return trace


def adapter_sha256(base_url: str, api_key: str, run_id: str) -> str:
    """The sha256 of the run's exported PEFT adapter (`export_lora`, the run's next seq_id)."""
    with WhitneyClient(base_url, api_key) as client:
        return client.run_operation(run_id, "export_lora", {})["sha256"]


def assert_same(a: Trace, b: Trace) -> None:
    """Bit for bit: every loss, logprob, sample, gradient norm and prompt logprob."""
    assert a.losses == b.losses
    assert a.grad_norms == b.grad_norms
    for step_a, step_b in zip(a.logprobs, b.logprobs, strict=True):
        for lp_a, lp_b in zip(step_a, step_b, strict=True):
            assert np.asarray(lp_a, np.float32).tobytes() == np.asarray(lp_b, np.float32).tobytes()
    assert [s[0] for s in a.samples] == [s[0] for s in b.samples]
    for (_, lp_a), (_, lp_b) in zip(a.samples, b.samples, strict=True):
        assert np.asarray(lp_a, np.float32).tobytes() == np.asarray(lp_b, np.float32).tobytes()
    assert a.prompt_logprobs == b.prompt_logprobs
