"""The OpenAI-compatible routes (docs/openai.md) through the official `openai` client, against
the suite's embedded server on loopback: answers are checked against Whitney's own `sample`
and `logprobs` operations of the same sampler, run over raw HTTP."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.local.helpers import adamw, datum, forward, http, new_run, run_op, sample_request
from whitney.local import EmbeddedWhitney

BOS, EOS = 256, 257  # local/* models: bytes, then these (whitney.tokenizers.ByteTokenizer)
USER = [{"role": "user", "content": "hi"}]
PROMPT = [BOS, *b"hi"]  # the raw renderer: BOS, the user's text, no markup


def text_of(tokens: list[int]) -> str:
    """What a byte-level model's tokens read as, its stop token left out."""
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def trained(embedded_server: EmbeddedWhitney) -> Iterator[dict[str, str]]:
    """Tenant A's local/tiny run after one optimizer step: its sampler and its checkpoint."""
    with http(embedded_server) as api:
        run_id = new_run(api, base_model="local/tiny", lora_rank=4, seed=3)["run_id"]
        run_op(
            api,
            run_id,
            1,
            "forward_backward",
            forward([datum(PROMPT, list(b"ok"))], "cross_entropy"),
        )
        run_op(api, run_id, 2, "optim_step", adamw(5e-2))
        run_op(api, run_id, 3, "save_weights_for_sampler", {"name": "s1"})
        run_op(api, run_id, 4, "save_state", {"name": "c1"})
        yield {
            "run_id": run_id,
            "sampler": f"whitney://runs/{run_id}/samplers/s1",
            "checkpoint": f"whitney://runs/{run_id}/states/c1",
        }


@pytest.fixture
def client(embedded_server: EmbeddedWhitney) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{embedded_server.url}/v1", api_key=embedded_server.api_keys[0], max_retries=0
    ) as c:
        yield c


def next_seq(api: httpx.Client, run_id: str) -> int:
    """The run's next seq_id (each test submits its own, whichever tests run)."""
    return api.get(f"/v1/training/runs/{run_id}").json()["next_seq_id"]


def whitney_sample(
    api: httpx.Client,
    run_id: str,
    prompt: list[int],
    n: int,
    max_tokens: int,
    **params: object,
) -> list[list[int]]:
    op = run_op(
        api,
        run_id,
        next_seq(api, run_id),
        "sample",
        sample_request(prompt, n, max_tokens, stop_token_ids=[EOS], **params),
        "s1",
    )
    return [s["tokens"] for s in op["result"]["sequences"]]


def whitney_logprobs(api: httpx.Client, run_id: str, sequence: list[int]) -> list[float | None]:
    op = run_op(
        api,
        run_id,
        next_seq(api, run_id),
        "logprobs",
        {"sequences": [{"token_ids": sequence}]},
        "s1",
    )
    return op["result"]["logprobs"][0]


def openai_error(exc: openai.APIStatusError) -> dict:
    body = exc.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_models_lists_the_base_models_and_only_the_tenants_samplers_and_checkpoints(
    embedded_server: EmbeddedWhitney, client: openai.OpenAI, trained: dict[str, str]
) -> None:
    ids = [m.id for m in client.models.list()]
    assert {"local/nano", "local/tiny", trained["sampler"], trained["checkpoint"]} <= set(ids)
    key = embedded_server.api_keys[1]
    with openai.OpenAI(base_url=f"{embedded_server.url}/v1", api_key=key, max_retries=0) as other:
        theirs = {m.id for m in other.models.list()}
    assert "local/tiny" in theirs and not {trained["sampler"], trained["checkpoint"]} & theirs


def test_greedy_chat_is_whitneys_top_k_1_sample_and_its_logprobs_whitneys(
    api: httpx.Client, client: openai.OpenAI, trained: dict[str, str]
) -> None:
    run_id = trained["run_id"]
    tokens = whitney_sample(api, run_id, PROMPT, 1, 12, top_k=1)[0]
    answer = client.chat.completions.create(
        model=trained["sampler"], messages=USER, max_tokens=12, temperature=0, logprobs=True
    )
    (choice,) = answer.choices
    content = tokens[:-1] if tokens[-1] == EOS else tokens
    assert choice.message.content == text_of(content)
    assert choice.finish_reason == ("stop" if tokens[-1] == EOS else "length")
    expected = whitney_logprobs(api, run_id, PROMPT + content)[len(PROMPT) :]
    assert [entry.logprob for entry in choice.logprobs.content] == expected  # bit for bit
    assert answer.usage.prompt_tokens == len(PROMPT)
    assert answer.usage.completion_tokens == len(tokens)
    base = client.chat.completions.create(
        model="local/tiny", messages=USER, max_tokens=12, temperature=0, logprobs=True
    )
    assert [e.logprob for e in base.choices[0].logprobs.content] != expected[
        : len(base.choices[0].logprobs.content)
    ]
    from_checkpoint = client.chat.completions.create(
        model=trained["checkpoint"], messages=USER, max_tokens=12, temperature=0, logprobs=True
    )
    assert from_checkpoint.choices[0].message.content == choice.message.content
    assert [e.logprob for e in from_checkpoint.choices[0].logprobs.content] == expected


def test_seeded_completions_with_n_are_whitneys_sample_and_a_stop_string_cuts_them(
    api: httpx.Client, client: openai.OpenAI, trained: dict[str, str]
) -> None:
    run_id = trained["run_id"]
    prompt = [BOS, *b"The"]
    expected = whitney_sample(api, run_id, prompt, 3, 10, temperature=0.8, seed=11)
    answer = client.completions.create(
        model=trained["sampler"], prompt="The", n=3, max_tokens=10, temperature=0.8, seed=11
    )
    texts = [c.text for c in answer.choices]
    assert texts == [text_of(t[:-1] if t[-1] == EOS else t) for t in expected]
    assert len(set(texts)) > 1  # three draws, not one
    with_logprobs = client.completions.create(
        model=trained["sampler"], prompt="The", max_tokens=10, temperature=0.8, seed=11, logprobs=0
    )
    first = expected[0][:-1] if expected[0][-1] == EOS else expected[0]
    lps = whitney_logprobs(api, run_id, prompt + first)[len(prompt) :]
    assert with_logprobs.choices[0].logprobs.token_logprobs == lps  # at temperature 1, bit for bit
    whole = texts[0]
    stop = whole[2]
    cut = client.completions.create(
        model=trained["sampler"], prompt="The", max_tokens=10, temperature=0.8, seed=11, stop=[stop]
    )
    assert cut.choices[0].text == whole[: whole.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < with_logprobs.usage.completion_tokens  # ended there


def test_several_prompts_are_one_whitney_sample_each_and_echo_repeats_them(
    api: httpx.Client, client: openai.OpenAI, trained: dict[str, str]
) -> None:
    run_id = trained["run_id"]
    texts = ["The", "ab"]
    answer = client.completions.create(
        model=trained["sampler"], prompt=texts, n=2, max_tokens=6, temperature=0.9, seed=2
    )
    expected = [
        text_of(t)
        for p in texts
        for t in whitney_sample(api, run_id, [BOS, *p.encode()], 2, 6, temperature=0.9, seed=2)
    ]
    assert [(c.index, c.text) for c in answer.choices] == list(enumerate(expected))
    assert answer.usage.prompt_tokens == 4 + 3
    echoed = client.completions.create(
        model=trained["sampler"],
        prompt=texts,
        n=2,
        max_tokens=6,
        temperature=0.9,
        seed=2,
        echo=True,
    )
    assert [c.text for c in echoed.choices] == [texts[i // 2] + t for i, t in enumerate(expected)]


def test_streamed_chunks_join_to_the_whole_answer(
    client: openai.OpenAI, trained: dict[str, str]
) -> None:
    request = {"model": trained["sampler"], "messages": USER, "max_tokens": 12, "temperature": 0}
    whole = client.chat.completions.create(**request).choices[0]
    chunks = list(
        client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
    )
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len(pieces) > 2 and "".join(pieces) == whole.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.finish_reason
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == len(PROMPT)
    completion = {"model": trained["sampler"], "prompt": "The", "n": 2, "max_tokens": 8, "seed": 5}
    texts = [c.text for c in client.completions.create(**completion).choices]
    joined = ["", ""]
    for chunk in client.completions.create(**completion, stream=True):
        joined[chunk.choices[0].index] += chunk.choices[0].text
    assert joined == texts


def whitney_alternatives(
    api: httpx.Client, run_id: str, context: list[int], top: int
) -> list[tuple[int, float]]:
    """The `top` most likely next tokens after `context` and their logprobs, from Whitney's
    `logprobs` operation of context + each token of the vocabulary (most likely first)."""
    vocabulary = range(EOS + 1)
    lps = [
        row[-1]
        for row in run_op(
            api,
            run_id,
            next_seq(api, run_id),
            "logprobs",
            {"sequences": [{"token_ids": [*context, t]} for t in vocabulary]},
            "s1",
        )["result"]["logprobs"]
    ]
    return sorted(zip(vocabulary, lps, strict=True), key=lambda pair: -pair[1])[:top]


def test_top_logprobs_are_the_most_likely_tokens_with_whitneys_logprobs(
    api: httpx.Client, client: openai.OpenAI, trained: dict[str, str]
) -> None:
    run_id = trained["run_id"]
    chat = client.chat.completions.create(
        model=trained["sampler"],
        messages=USER,
        max_tokens=3,
        temperature=0.7,
        seed=4,
        logprobs=True,
        top_logprobs=3,
    )
    entries = chat.choices[0].logprobs.content
    tokens = [bytes(e.bytes)[0] for e in entries]  # ASCII here: one byte, one token
    for k, entry in enumerate(entries):
        best = whitney_alternatives(api, run_id, PROMPT + tokens[:k], 3)
        assert [(bytes(a.bytes)[0], a.logprob) for a in entry.top_logprobs] == best  # bit for bit
        assert entry.logprob == dict(best).get(tokens[k], entry.logprob)
    completion = client.completions.create(
        model=trained["sampler"], prompt="The", max_tokens=2, temperature=0, logprobs=2
    )
    best = whitney_alternatives(api, run_id, [BOS, *b"The"], 2)
    first = completion.choices[0].logprobs.top_logprobs[0]
    assert sorted(first.values(), reverse=True) == [lp for _, lp in best]
    assert completion.choices[0].logprobs.tokens[0] == chr(best[0][0])  # greedy: the top one


def test_n_chat_choices_stream_per_index_with_their_logprobs(
    client: openai.OpenAI, trained: dict[str, str]
) -> None:
    request = {
        "model": trained["sampler"],
        "messages": USER,
        "max_tokens": 8,
        "n": 2,
        "seed": 7,
        "logprobs": True,
        "top_logprobs": 1,
        "stop": ["e"],
    }
    whole = client.chat.completions.create(**request).choices
    texts, logprobs, finish = ["", ""], [[], []], [None, None]
    for chunk in client.chat.completions.create(**request, stream=True):
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        logprobs[choice.index] += choice.logprobs.content if choice.logprobs else []
        finish[choice.index] = choice.finish_reason or finish[choice.index]
    assert texts == [c.message.content for c in whole]
    assert logprobs == [c.logprobs.content for c in whole]
    assert finish == [c.finish_reason for c in whole]


def test_a_wrong_key_is_401_in_openais_shape(embedded_server: EmbeddedWhitney) -> None:
    url = f"{embedded_server.url}/v1"
    with (
        openai.OpenAI(base_url=url, api_key="not-a-key", max_retries=0) as bad,
        pytest.raises(openai.AuthenticationError) as caught,
    ):
        bad.chat.completions.create(model="local/tiny", messages=USER, max_tokens=2)
    error = openai_error(caught.value)
    assert caught.value.status_code == 401
    assert error["type"] == "authentication_error" and error["code"] == "unauthorized"
    assert "not-a-key" not in caught.value.response.text


def test_another_tenants_checkpoint_is_404_naming_the_model(
    embedded_server: EmbeddedWhitney, trained: dict[str, str]
) -> None:
    key = embedded_server.api_keys[1]
    with openai.OpenAI(base_url=f"{embedded_server.url}/v1", api_key=key, max_retries=0) as other:
        for model in (trained["checkpoint"], trained["sampler"], "local/nope"):
            with pytest.raises(openai.NotFoundError) as caught:
                other.chat.completions.create(model=model, messages=USER, max_tokens=2)
            error = openai_error(caught.value)
            assert error["param"] == "model" and error["code"] == "not_found", error


@pytest.mark.parametrize(
    ("request_", "param", "status", "needle"),
    [
        ({"max_tokens": 5000}, "max_tokens", 422, "max_tokens of 1024"),
        ({"n": 1000}, "n", 422, "max_num_samples"),
        ({"temperature": 3}, "temperature", 400, "temperature"),
        ({"top_logprobs": 2}, "top_logprobs", 400, "logprobs: true"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
            "tools",
            400,
            "tool and function calling",
        ),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", 400, "role"),
    ],
)
def test_a_request_over_a_limit_or_invalid_is_refused_naming_the_field(
    client: openai.OpenAI, request_: dict, param: str, status: int, needle: str
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(**{"model": "local/tiny", "messages": USER, **request_})
    error = openai_error(caught.value)
    assert caught.value.status_code == status and error["param"] == param, error
    assert needle in error["message"]


def test_unknown_routes_and_methods_under_v1_answer_in_openais_shape(
    api: httpx.Client,
) -> None:
    for method, path, status in (
        ("POST", "/v1/embeddings", 404),
        ("GET", "/v1/chat/completions", 405),
        ("DELETE", "/v1/models", 405),
    ):
        response = api.request(method, path)
        assert response.status_code == status
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    whitneys = api.get("/v1/training/nope").json()["error"]  # the training API's own shape
    assert whitneys["type"] == "not_found" and "param" not in whitneys


def test_a_stream_the_client_leaves_stops_the_sampling(
    embedded_server: EmbeddedWhitney, client: openai.OpenAI
) -> None:
    """Chunks leave as tokens are sampled: the client reads two and hangs up long before the
    1000th token, and the engine's sample is cancelled (counted when it raises)."""
    models = embedded_server.service.models
    client.chat.completions.create(model="local/tiny", messages=USER, max_tokens=1)  # built
    before = models.cancelled
    stream = client.chat.completions.create(  # greedy: a random draw could end it with EOS
        model="local/tiny", messages=USER, max_tokens=1000, temperature=0, stream=True
    )
    assert [c.choices[0].delta.content is not None for c in itertools.islice(stream, 2)] == [
        True,
        True,
    ]
    stream.close()
    deadline = time.monotonic() + 30
    while models.cancelled == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert models.cancelled == before + 1
    answer = client.chat.completions.create(model="local/tiny", messages=USER, max_tokens=2)
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_a_client_that_disconnects_before_a_whole_answer_stops_the_sampling(
    embedded_server: EmbeddedWhitney,
) -> None:
    models = embedded_server.service.models
    before = models.cancelled
    body = {"model": "local/tiny", "messages": USER, "max_tokens": 1000, "temperature": 0}
    with http(embedded_server) as raw, contextlib.suppress(httpx.TimeoutException):
        raw.post("/v1/chat/completions", json=body, timeout=0.5)  # gives up, hangs up
        pytest.fail("answered within the client's half second: nothing to cancel")
    deadline = time.monotonic() + 30
    while models.cancelled == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert models.cancelled == before + 1


def test_a_critics_checkpoint_is_400_it_has_no_sampler(
    api: httpx.Client, client: openai.OpenAI
) -> None:
    run_id = new_run(api, base_model="local/nano", role="critic")["run_id"]
    run_op(api, run_id, 1, "save_state", {"name": "v"})
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=f"whitney://runs/{run_id}/states/v", messages=USER, max_tokens=2
        )
    error = openai_error(caught.value)
    assert error["param"] == "model" and "critic" in error["message"]
