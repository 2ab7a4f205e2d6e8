"""What the embedded server does not serve, the SDK hears as its own exceptions naming it;
another tenant's models are 404; bodies are measured before and after zstd; a request's
future answers once the request is done; malformed protobuf or JSON is a 400 naming the
field; random bodies on every Tinker route never get a 5xx or an answer without the error
body."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output

from tests.local.served import ServedWhitney, served
from tests.tinker.steps import KEYS, MAX_BODY_BYTES, sdk_key

TOKENS = [5, 9, 12, 40]
JSON_ROUTES = (
    "create_session",
    "session_heartbeat",
    "create_model",
    "get_info",
    "unload_model",
    "optim_step",
    "save_weights",
    "save_weights_for_sampler",
    "load_weights",
    "create_sampling_session",
    "asample",
    "retrieve_future",
    "client/config",
    "telemetry",
)


@pytest.fixture(scope="module")
def training(server: ServedWhitney) -> tinker.TrainingClient:
    service = tinker.ServiceClient(base_url=server.url, api_key=sdk_key(0))
    return service.create_lora_training_client(base_model="local/tiny", rank=4).result()


@pytest.fixture
def api(server: ServedWhitney) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"X-API-Key": sdk_key(0)}, timeout=60) as client:
        yield client


def _datum() -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={"target_tokens": TOKENS[1:]},
    )


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize(
    ("loss", "error", "named"),
    [
        ("custom", tinker.BadRequestError, "custom loss"),
        ("gspo", tinker.UnprocessableEntityError, "gspo"),
        ("stable_reinforce", tinker.UnprocessableEntityError, "stable_reinforce"),
    ],
)
def test_a_loss_the_route_does_not_serve_is_the_sdks_exception_naming_it(
    training: tinker.TrainingClient, loss: str, error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        training.forward_backward([_datum()], loss).result(timeout=60)


def test_top_k_logprobs_images_greedy_sampling_and_five_stops_are_refused_naming_them(
    server: ServedWhitney,
) -> None:
    service = tinker.ServiceClient(base_url=server.url, api_key=sdk_key(0))
    training = service.create_lora_training_client(base_model="local/tiny", rank=4).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(TOKENS)
    params = types.SamplingParams(max_tokens=2, seed=1)
    with pytest.raises(tinker.BadRequestError, match="top-k logprobs"):
        sampler.sample(prompt, 1, params, topk_prompt_logprobs=3).result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="temperature 0"):
        greedy = types.SamplingParams(max_tokens=2, temperature=0.0)
        sampler.sample(prompt, 1, greedy).result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="sampling_params.stop"):
        five = types.SamplingParams(max_tokens=2, stop=["a", "b", "c", "d", "e"])
        sampler.sample(prompt, 1, five).result(timeout=60)
    image = types.ModelInput(chunks=[types.ImageChunk(data=b"\x89PNG....", format="png")])
    datum = types.Datum(model_input=image, loss_fn_inputs={"target_tokens": [1]})
    with pytest.raises(tinker.BadRequestError, match="image chunks"):
        training.forward_backward([datum], "cross_entropy").result(timeout=60)


def test_another_tenants_model_future_and_sampler_are_404(
    server: ServedWhitney, training: tinker.TrainingClient, api: httpx.Client
) -> None:
    future = training.forward([_datum()], "cross_entropy")
    future.result(timeout=60)
    sampler = training.save_weights_for_sampler("for-404").result()
    with httpx.Client(base_url=server.url, headers={"X-API-Key": sdk_key(1)}, timeout=60) as other:
        model = {"model_id": training.model_id}
        _error(other.post("/api/v1/get_info", json=model), 404)
        step = {**model, "seq_id": 99, "optim_params": {"learning_rate": 0.1}}
        _error(other.post("/api/v1/optim_step", json=step), 404)
        _error(other.post("/api/v1/unload_model", json=model), 404)
        sampling = {"model_path": sampler.path, "sampling_session_seq_id": 0}
        _error(other.post("/api/v1/create_sampling_session", json=sampling), 404)
        request_id = f"{training.model_id}#1"
        _error(other.post("/api/v1/retrieve_future", json={"request_id": request_id}), 404)
    assert api.post("/api/v1/get_info", json=model).status_code == 200
    assert (
        api.post("/api/v1/get_info", headers={"X-API-Key": "tml-wrong"}, json=model).status_code
        == 401
    )


def _raw_model(api: httpx.Client) -> str:
    """A new model of tenant A, created over raw HTTP."""
    session = api.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
    model = {"session_id": session, "model_seq_id": 0, "base_model": "local/tiny"}
    return api.post("/api/v1/create_model", json=model).json()["model_id"]


def _fwdbwd(model_id: str, target: bytes, seq_id: int = 1) -> bytes:
    message = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy")
    datum = message.data.add()
    datum.model_input.add().encoded_text.tokens = np.asarray(TOKENS[:-1], np.int32).tobytes()
    datum.loss_fn_inputs["target_tokens"].dtype = pb.DTYPE_INT64
    datum.loss_fn_inputs["target_tokens"].shape.append(3)
    datum.loss_fn_inputs["target_tokens"].dense = target
    return message.SerializeToString()


PROTO = {"Content-Type": "application/x-protobuf"}


def test_a_small_zstd_body_that_inflates_past_the_limit_is_413_without_inflating_it(
    api: httpx.Client,
) -> None:
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (50 * MAX_BODY_BYTES))
    assert len(bomb) < 10_000
    started = time.monotonic()
    error = _error(
        api.post(
            "/api/v1/forward_backward", content=bomb, headers={**PROTO, "Content-Encoding": "zstd"}
        ),
        413,
    )
    assert "inflates past" in error["message"] and error["details"]["max"] == MAX_BODY_BYTES
    assert time.monotonic() - started < 20
    plain = b"\0" * (MAX_BODY_BYTES + 1)
    assert _error(api.post("/api/v1/forward_backward", content=plain, headers=PROTO), 413)
    corrupt = {**PROTO, "Content-Encoding": "zstd"}
    error = _error(api.post("/api/v1/forward_backward", content=b"nope", headers=corrupt), 400)
    assert "zstd" in error["message"]
    # a well-formed compressed body under the limit is served
    body = zstandard.ZstdCompressor().compress(
        _fwdbwd(_raw_model(api), np.asarray(TOKENS[1:], np.int64).tobytes())
    )
    answer = api.post("/api/v1/forward_backward", content=body, headers=corrupt)
    assert answer.status_code == 200, answer.text


def test_the_sdks_own_forward_backward_body_zstd_compressed_answers_as_sent_plain(
    api: httpx.Client,
) -> None:
    """The server asks the SDK for plain bodies (`proto_compress_fwdbwd` off, Tinker's default);
    a body the SDK's own serializer wrote and zstd compressed, as the SDK sends it with the flag
    on, is served: the same forward answer, bit for bit, as the plain one."""
    flags = api.post("/api/v1/client/config", json={}).json()
    assert flags["proto_compress_fwdbwd"] is False
    model = _raw_model(api)
    fwd = types.ForwardBackwardInput(data=[_datum()], loss_fn="cross_entropy")
    answers = []
    for seq_id, compress in ((1, False), (2, True)):
        request = types.ForwardBackwardRequest(fwd, model_id=model, seq_id=seq_id)
        message = forward_backward_request_to_proto(request)
        message.forward_only = True
        body, headers = message.SerializeToString(), dict(PROTO)
        if compress:
            body, headers["Content-Encoding"] = zstandard.ZstdCompressor().compress(body), "zstd"
        future = api.post("/api/v1/forward_backward", content=body, headers=headers)
        assert future.status_code == 200, future.text
        answer = api.post(
            "/api/v1/retrieve_future", json={"request_id": future.json()["request_id"]}
        )
        assert answer.headers["content-type"] == PROTO["Content-Type"], answer.text
        answers.append(answer.content)
    assert answers[0] == answers[1]
    output = deserialize_forward_backward_output(answers[1])
    assert np.isfinite(output.metrics["loss:sum"]) and output.metrics["loss:sum"] > 0


def test_a_requests_future_is_answered_once_the_request_is_done(
    server: ServedWhitney, api: httpx.Client
) -> None:
    """The POST of a training request answers when the request is done (at most
    `post_wait_s`), as Whitney's POST of an operation does: by then its operation is terminal
    in the journal, and `retrieve_future` answers it at once."""
    model = _raw_model(api)
    body = _fwdbwd(model, np.asarray(TOKENS[1:], np.int64).tobytes())
    futures = [api.post("/api/v1/forward_backward", content=body, headers=PROTO).json()]
    step = {"model_id": model, "seq_id": 2, "optim_params": {"learning_rate": 0.01}}
    futures.append(api.post("/api/v1/optim_step", json=step).json())
    with server.client(0) as whitney:
        journal = whitney.get(f"/v1/training/runs/{model}/operations").json()["operations"]
    assert [(op["kind"], op["status"]) for op in journal] == [
        ("forward_backward", "succeeded"),
        ("optim_step", "succeeded"),
    ]
    for future in futures:
        answer = api.post("/api/v1/retrieve_future", json={"request_id": future["request_id"]})
        assert answer.status_code == 200 and "try_again" not in answer.text


def test_with_the_keys_long_polls_all_taken_a_future_is_answered_at_once(
    tmp_path: Path,
) -> None:
    """The wait for a request is one of the key's long-polls: with none left, its future is
    answered at once, before the request is done, and `retrieve_future` gives the result."""
    with (
        served(tmp_path, "--max-long-polls-per-tenant", "1", keys=KEYS) as server,
        httpx.Client(base_url=server.url, headers={"X-API-Key": sdk_key(0)}, timeout=60) as api,
        server.client(0) as whitney,
        ThreadPoolExecutor(1) as pool,
    ):
        model = _raw_model(api)
        tokens = [int(t) for t in np.arange(255) % 90 + 5]
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:]},
        )
        fwd = types.ForwardBackwardInput(data=[datum] * 64, loss_fn="cross_entropy")
        request = types.ForwardBackwardRequest(fwd, model_id=model, seq_id=1)
        body = forward_backward_request_to_proto(request).SerializeToString()
        with httpx.Client(
            base_url=server.url, headers={"X-API-Key": sdk_key(0)}, timeout=60
        ) as other:
            held = pool.submit(other.post, "/api/v1/forward_backward", content=body, headers=PROTO)
            operations = f"/v1/training/runs/{model}/operations"
            while not whitney.get(operations).json()["operations"]:
                time.sleep(0.01)  # journaled: its answer now holds the one long-poll
            time.sleep(0.05)
            step = {"model_id": model, "seq_id": 2, "optim_params": {"learning_rate": 0.01}}
            future = api.post("/api/v1/optim_step", json=step).json()
            journal = whitney.get(operations).json()["operations"]
            assert [op["kind"] for op in journal] == ["forward_backward", "optim_step"]
            assert journal[1]["status"] == "pending"
            assert held.result().status_code == 200
        answer = api.post("/api/v1/retrieve_future", json={"request_id": future["request_id"]})
        assert answer.status_code == 200 and "grad_norm" in answer.json()["metrics"]


def test_malformed_protobuf_and_json_are_400_naming_the_field(
    api: httpx.Client, training: tinker.TrainingClient
) -> None:
    ragged = _fwdbwd(training.model_id, b"\1\2\3")
    error = _error(api.post("/api/v1/forward_backward", content=ragged, headers=PROTO), 400)
    assert error["details"]["field"] == "data[0].loss_fn_inputs.target_tokens"
    truncated = _fwdbwd(training.model_id, b"\0" * 24)[:-5]
    error = _error(api.post("/api/v1/forward_backward", content=truncated, headers=PROTO), 400)
    assert error["details"]["field"] == "loss_fn"  # the last field, cut short
    as_json = api.post("/api/v1/forward_backward", json={"model_id": training.model_id})
    assert _error(as_json, 400)["details"]["field"] == "Content-Type"
    broken = api.post(
        "/api/v1/optim_step", content=b"{", headers={"Content-Type": "application/json"}
    )
    assert _error(broken, 400)["details"]["field"] == "body"
    missing = api.post("/api/v1/optim_step", json={"seq_id": 1, "optim_params": {}})
    assert _error(missing, 400)["details"]["field"] == "model_id"
    nan = b'{"model_id": "%s", "seq_id": 1000000, "optim_params": {"learning_rate": NaN}}'
    answer = api.post(
        "/api/v1/optim_step",
        content=nan % training.model_id.encode(),
        headers={"Content-Type": "application/json"},
    )
    assert 400 <= answer.status_code < 500
    assert answer.json()["error"]["details"]["field"].endswith("optimizer.learning_rate")
    huge = {"model_id": training.model_id, "seq_id": 2**70, "optim_params": {}}
    assert _error(api.post("/api/v1/optim_step", json=huge), 400)["details"]["field"] == "seq_id"
    bad_params = {"model_id": training.model_id, "seq_id": 1, "optim_params": [1]}
    assert _error(api.post("/api/v1/optim_step", json=bad_params), 400)["details"]["field"] == (
        "optim_params"
    )


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "model_id": st.text(max_size=30) | st.integers(),
        "seq_id": st.integers(min_value=-5, max_value=2**70) | st.text(max_size=3),
        "session_id": st.text(max_size=30),
        "path": st.text(max_size=40),
        "request_id": st.text(max_size=40),
        "base_model": st.sampled_from(["local/tiny", "nope", ""]),
        "optim_params": _JSON,
        "sampling_params": _JSON,
        "prompt": _JSON,
        "sampling_session_id": st.text(max_size=30),
    },
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(route=st.sampled_from(JSON_ROUTES), body=_FIELDS | _JSON)
def test_random_json_bodies_never_get_a_server_error(
    api: httpx.Client, route: str, body: object
) -> None:
    answer = api.post(f"/api/v1/{route}", json=body)
    assert answer.status_code < 500, answer.text
    if answer.status_code >= 400:
        assert set(answer.json()["error"]) >= {"type", "message", "details"}


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(raw=st.binary(max_size=200))
def test_random_protobuf_bodies_never_get_a_server_error(api: httpx.Client, raw: bytes) -> None:
    answer = api.post("/api/v1/forward_backward", content=raw, headers=PROTO)
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.json()["error"]["message"]
