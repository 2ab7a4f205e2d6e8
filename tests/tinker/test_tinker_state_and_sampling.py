"""Checkpoints and sampling through the official SDK: `save_state` then `load_state` with the
optimizer resumes bit for bit, without it restarts the moments (as a new client from the state
does); a base model samples; stop strings end a sequence where its text completes one, and
sampling stops there (no token is drawn past it); closing the ServiceClient finishes its session
and its runs."""

from __future__ import annotations

import warnings

import numpy as np
import tinker
from tinker import types

from tests.local.served import ServedWhitney
from tests.tinker.steps import ADAM, KEYS, PROMPT, sdk_key, sl_rows
from whitney import WhitneyClient
from whitney.tokenizers import get_tokenizer


def _sl() -> list[types.Datum]:
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(row["input"]),
            loss_fn_inputs={"target_tokens": row["target_tokens"], "weights": row["weights"]},
        )
        for row in sl_rows()
    ]


def _step(training: tinker.TrainingClient) -> tuple[float, float, bytes]:
    """One SL step, then a forward: (loss, grad norm, the forward's logprobs as bytes)."""
    result = training.forward_backward(_sl(), "cross_entropy")
    optim = training.optim_step(types.AdamParams(**ADAM))
    loss = result.result().metrics["loss:sum"]
    grad_norm = optim.result().metrics["grad_norm"]
    after = training.forward(_sl(), "cross_entropy").result()
    logprobs = b"".join(
        np.asarray(o["logprobs"].data, np.float32).tobytes() for o in after.loss_fn_outputs
    )
    return loss, grad_norm, logprobs


def test_load_state_with_and_without_the_optimizer(server: ServedWhitney) -> None:
    service = tinker.ServiceClient(base_url=server.url, api_key=sdk_key(0))
    training = service.create_lora_training_client(base_model="local/tiny", rank=4, seed=5).result()
    _step(training)
    path = training.save_state("after-one").result().path
    assert path == f"tinker://{training.model_id}/weights/after-one"
    resumed = _step(training)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        training.load_state_with_optimizer(path).result()
        assert _step(training) == resumed
        training.load_state(path).result()
    fresh_moments = _step(training)
    assert fresh_moments[0] == resumed[0]  # the same weights before the step
    assert fresh_moments[2] != resumed[2]  # a different update: the moments restarted
    with_optimizer = service.create_training_client_from_state_with_optimizer(path).result()
    assert _step(with_optimizer) == resumed
    weights_only = service.create_training_client_from_state(path).result()
    assert _step(weights_only) == fresh_moments
    assert weights_only.get_info().model_data.model_name == "local/tiny"


def test_a_base_model_samples_and_stop_strings_end_sampling_where_the_text_completes_one(
    server: ServedWhitney,
) -> None:
    service = tinker.ServiceClient(base_url=server.url, api_key=sdk_key(1))
    sampler = service.create_sampling_client(base_model="local/tiny")
    prompt = types.ModelInput.from_ints(PROMPT)
    free = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=12, seed=4)).result()
    tokens = list(free.sequences[0].tokens)
    assert len(tokens) >= 6
    decode = get_tokenizer("local/tiny").decode
    stop = decode(tokens[4:6])
    expected = next(k for k in range(1, len(tokens) + 1) if stop in decode(tokens[:k]))
    params = types.SamplingParams(max_tokens=12, seed=4, stop=[stop])
    cut = sampler.sample(prompt, 1, params).result().sequences[0]
    assert list(cut.tokens) == tokens[:expected]
    assert cut.stop_reason == "stop"
    assert list(cut.logprobs) == list(free.sequences[0].logprobs[:expected])
    with WhitneyClient(server.url, KEYS[1]) as client:
        (run_id,) = client.get_session(service.holder.get_session_id()).run_ids
        samples = [op for op in client.iter_journal(run_id) if op.kind == "sample"]
    assert [op.usage["sampled_tokens"] for op in samples] == [len(tokens), expected]


def test_closing_the_service_client_finishes_its_session_and_runs(server: ServedWhitney) -> None:
    service = tinker.ServiceClient(base_url=server.url, api_key=sdk_key(0))
    training = service.create_lora_training_client(base_model="local/tiny", rank=4).result()
    session_id = service.holder.get_session_id()
    service.close("success").result()
    with WhitneyClient(server.url, KEYS[0]) as client:
        assert client.get_session(session_id).status == "closed"
        assert client.wait_terminal(training.model_id, timeout=60).status in (
            "finished",
            "cancelled",
        )


def test_two_sampling_clients_on_one_path_each_sample_their_own_requests(
    server: ServedWhitney,
) -> None:
    """Each SDK sampling client numbers its requests from 0: two on one saved sampler, in one
    ServiceClient or two, are two streams, so neither's request 0 is taken for the other's."""
    service = tinker.ServiceClient(base_url=server.url, api_key=sdk_key(0))
    training = service.create_lora_training_client(base_model="local/tiny", rank=4, seed=5).result()
    _step(training)
    path = training.save_weights_for_sampler("shared").result().path
    prompt = types.ModelInput.from_ints(PROMPT)
    params = [types.SamplingParams(max_tokens=6, seed=seed) for seed in (1, 2, 3)]
    clients = [
        service.create_sampling_client(model_path=path),
        service.create_sampling_client(model_path=path),
        tinker.ServiceClient(base_url=server.url, api_key=sdk_key(0)).create_sampling_client(
            model_path=path
        ),
    ]
    # alone, each seed's sample from a client of its own
    alone = [
        list(
            service.create_sampling_client(model_path=path)
            .sample(prompt, 1, p)
            .result()
            .sequences[0]
            .tokens
        )
        for p in params
    ]
    drawn = [
        list(c.sample(prompt, 1, p).result().sequences[0].tokens)
        for c, p in zip(clients, params, strict=True)
    ]
    assert drawn == alone
    assert len({tuple(tokens) for tokens in alone}) > 1  # the seeds do differ
