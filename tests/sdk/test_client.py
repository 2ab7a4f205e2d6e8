"""WhitneyClient against respx: the faults a real server cannot easily produce.

Time is faked: `whitney.clock.monotonic` and `sleep` are replaced, so no test really sleeps and
every delay the client chose is recorded.
"""

import json
import logging
import pickle
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
import respx

import whitney.clock
import whitney.transport
from whitney import errors, wire
from whitney.client import WhitneyClient
from whitney.datums import rl_datum, sft_datum
from whitney.payloads import adamw_optimizer, forward_backward_payload, sample_request

BASE = "http://whitney.test"
KEY = "sk-SECRET-abc123"
OPS = "/v1/training/runs/run-1/operations"


class FakeTime:
    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture(autouse=True)
def fake_time(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(whitney.clock, "monotonic", fake.clock)
    monkeypatch.setattr(whitney.clock, "sleep", fake.sleep)
    return fake


@pytest.fixture
def mock():
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router


@pytest.fixture
def client():
    with WhitneyClient(BASE, KEY) as whitney_client:
        yield whitney_client


def run_json(status="ready", next_seq_id=1, run_id="run-1"):
    return {
        "run_id": run_id,
        "session_id": "sess-1",
        "provider": "local",
        "base_model": "tiny",
        "lora_rank": 8,
        "role": "policy",
        "trainable": True,
        "status": status,
        "next_seq_id": next_seq_id,
        "step": 0,
        "error": None,
        "created_at": "2025-01-01T00:00:00Z",
    }


def op_json(seq_id, kind="save_state", status="succeeded", result=None, **extra):
    body = {
        "run_id": "run-1",
        "seq_id": seq_id,
        "kind": kind,
        "sampler_id": None,
        "status": status,
        "result": result,
        "error": None,
        "usage": {"tokens": 0},
        "submitted_at": "2025-01-01T00:00:00Z",
        "finished_at": None,
    }
    body.update(extra)
    return body


def session_json(session_id="sess-1", status="open", labels=None, **extra):
    return {
        "session_id": session_id,
        "status": status,
        "labels": labels or {},
        "created_at": "2025-01-01T00:00:00Z",
        **extra,
    }


def error_response(status, type_, message, details=None, headers=None):
    body = {"error": {"type": type_, "message": message, "details": details or {}}}
    return httpx.Response(status, json=body, headers=headers)


def sent(call):
    return json.loads(call.request.content)


def echo_operation(request):
    """A server that runs every operation at once, answering its seq_id as the result."""
    body = json.loads(request.content)
    return httpx.Response(
        200, json=op_json(body["seq_id"], body["kind"], result={"seq": body["seq_id"]})
    )


def fb_payload():
    return forward_backward_payload(
        [rl_datum([1, 2], [3, 4], [-0.5, -1.0], 1.0)], "importance_sampling"
    )


# -- configuration ---------------------------------------------------------------------------


def test_env_vars_are_the_defaults(monkeypatch, mock):
    monkeypatch.setenv("WHITNEY_API_URL", BASE + "/")
    monkeypatch.setenv("WHITNEY_API_KEY", KEY)
    route = mock.get("/v1/training/runs/run-1").respond(json=run_json())
    with WhitneyClient() as client:
        assert client.base_url == BASE
        client.get_run("run-1")
    assert route.calls.last.request.headers["Authorization"] == f"Bearer {KEY}"


def test_arguments_win_over_env_vars(monkeypatch, mock):
    monkeypatch.setenv("WHITNEY_API_URL", "http://elsewhere.test")
    monkeypatch.setenv("WHITNEY_API_KEY", "sk-from-env")
    route = mock.get("/v1/training/runs/run-1").respond(json=run_json())
    with WhitneyClient(BASE, "sk-argument") as client:
        client.get_run("run-1")
    assert route.calls.last.request.headers["Authorization"] == "Bearer sk-argument"


@pytest.mark.parametrize(
    ("present", "missing"),
    [("WHITNEY_API_KEY", "WHITNEY_API_URL"), ("WHITNEY_API_URL", "WHITNEY_API_KEY")],
)
def test_a_missing_env_var_is_named(monkeypatch, present, missing):
    monkeypatch.delenv(missing, raising=False)
    monkeypatch.setenv(present, BASE if present == "WHITNEY_API_URL" else KEY)
    with pytest.raises(ValueError, match=missing):
        WhitneyClient()


def test_a_non_http_base_url_is_refused():
    with pytest.raises(ValueError, match="http"):
        WhitneyClient("whitney.test", KEY)


# -- retries ---------------------------------------------------------------------------------


def test_a_dropped_connection_is_retried_with_the_same_seq_id_and_body(mock, client, fake_time):
    route = mock.post(OPS).mock(
        side_effect=[
            httpx.RemoteProtocolError("Server disconnected without sending a response."),
            httpx.Response(200, json=op_json(3, "forward_backward", result={"loss": 1.5})),
        ]
    )
    result = client.run_operation("run-1", "forward_backward", fb_payload(), seq_id=3)
    assert result == {"loss": 1.5}
    assert route.call_count == 2
    first, second = route.calls
    assert first.request.content == second.request.content
    assert sent(first) == {"seq_id": 3, "kind": "forward_backward", "payload": fb_payload()}
    assert len(fake_time.sleeps) == 1
    assert 0.0 <= fake_time.sleeps[0] <= 0.2


def test_a_retry_of_an_auto_numbered_operation_keeps_its_seq_id(mock, client):
    run = mock.get("/v1/training/runs/run-1").respond(json=run_json(next_seq_id=7))
    route = mock.post(OPS).mock(
        side_effect=[httpx.ConnectError("connection reset"), echo_operation, echo_operation]
    )
    assert client.run_operation("run-1", "save_state", {}) == {"seq": 7}
    assert client.run_operation("run-1", "save_state", {}) == {"seq": 8}
    assert [sent(call)["seq_id"] for call in route.calls] == [7, 7, 8]
    assert run.call_count == 1


@pytest.mark.parametrize(
    "fault",
    [
        httpx.ReadTimeout("timed out"),
        httpx.ConnectTimeout("timed out"),
        httpx.Response(500, text="Internal Server Error"),
        httpx.Response(502, text="<html>Bad Gateway</html>"),
        error_response(503, "unavailable", "provider busy"),
        httpx.Response(504),
    ],
)
def test_timeouts_and_5xx_are_retried(mock, client, fault):
    route = mock.post(OPS).mock(side_effect=[fault, echo_operation])
    assert client.run_operation("run-1", "export_lora", {}, seq_id=4) == {"seq": 4}
    assert route.call_count == 2
    assert route.calls[0].request.content == route.calls[1].request.content


def test_retry_after_is_honoured(mock, client, fake_time):
    route = mock.post(OPS).mock(
        side_effect=[
            error_response(429, "rate_limited", "slow down", headers={"Retry-After": "7"}),
            error_response(503, "unavailable", "busy", headers={"Retry-After": "2.5"}),
            echo_operation,
        ]
    )
    assert client.run_operation("run-1", "export_lora", {}, seq_id=1) == {"seq": 1}
    assert fake_time.sleeps == [7.0, 2.5]
    assert route.call_count == 3


def test_a_positive_retry_after_is_waited_for_past_max_attempts_within_the_time(mock, fake_time):
    rebuilding = error_response(503, "unavailable", "run rebuilt", headers={"Retry-After": "1"})
    route = mock.post(OPS).mock(side_effect=[rebuilding] * 10 + [echo_operation])
    with WhitneyClient(BASE, KEY, max_attempts=6, max_retry_seconds=120) as client:
        assert client.run_operation("run-1", "export_lora", {}, seq_id=1) == {"seq": 1}
    assert route.call_count == 11
    assert fake_time.sleeps == [1.0] * 10

    route.reset()
    route.mock(return_value=rebuilding)
    with (
        WhitneyClient(BASE, KEY, max_attempts=6, max_retry_seconds=30) as client,
        pytest.raises(errors.Unavailable) as caught,
    ):
        client.run_operation("run-1", "export_lora", {}, seq_id=1)
    assert route.call_count == 31  # 30 waits of 1 s fit in 30 s; the 31st would not
    assert "gave up after 31 attempts in 30.0 s" in str(caught.value)


def test_retry_after_as_an_http_date(mock, client, fake_time):
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    mock.get("/v1/training/runs/run-1").mock(
        side_effect=[
            error_response(429, "rate_limited", "slow down", headers={"Retry-After": when}),
            httpx.Response(200, json=run_json()),
        ]
    )
    client.get_run("run-1")
    assert len(fake_time.sleeps) == 1
    assert 25.0 < fake_time.sleeps[0] <= 30.0


def test_a_retry_after_beyond_the_time_budget_raises_at_once(mock, fake_time):
    route = mock.post(OPS).mock(
        return_value=error_response(429, "rate_limited", "later", headers={"Retry-After": "500"})
    )
    with (
        WhitneyClient(BASE, KEY, max_retry_seconds=120) as client,
        pytest.raises(errors.RateLimited) as caught,
    ):
        client.run_operation("run-1", "export_lora", {}, seq_id=1)
    assert caught.value.retry_after == 500.0
    assert caught.value.retryable is True
    assert route.call_count == 1
    assert fake_time.sleeps == []


def test_backoff_is_exponential_full_jitter_capped(mock, fake_time, monkeypatch):
    ceilings = []

    def top_of_range(low, high):
        ceilings.append((low, high))
        return high

    monkeypatch.setattr(whitney.transport.random, "uniform", top_of_range)
    route = mock.post(OPS).respond(503)
    with (
        WhitneyClient(BASE, KEY, max_attempts=6, backoff_base=1.0, backoff_max=3.0) as client,
        pytest.raises(errors.ServerError) as caught,
    ):
        client.run_operation("run-1", "export_lora", {}, seq_id=1)
    assert caught.value.status == 503
    assert route.call_count == 6
    assert ceilings == [(0.0, 1.0), (0.0, 2.0), (0.0, 3.0), (0.0, 3.0), (0.0, 3.0)]
    assert fake_time.sleeps == [1.0, 2.0, 3.0, 3.0, 3.0]


def test_retries_are_bounded_by_total_time(mock, fake_time, monkeypatch):
    monkeypatch.setattr(whitney.transport.random, "uniform", lambda low, high: high)
    route = mock.post(OPS).respond(503)
    with (
        WhitneyClient(BASE, KEY, backoff_base=1.0, max_retry_seconds=2.5) as client,
        pytest.raises(errors.ServerError),
    ):
        client.run_operation("run-1", "export_lora", {}, seq_id=1)
    # 1 s after the first failure fits in 2.5 s; 2 s more after the second would not.
    assert fake_time.sleeps == [1.0]
    assert route.call_count == 2


def test_transport_errors_exhaust_into_a_transport_error(mock, fake_time):
    route = mock.get("/v1/training/capabilities").mock(side_effect=httpx.ConnectError)
    with (
        WhitneyClient(BASE, KEY, max_attempts=3) as client,
        pytest.raises(errors.TransportError) as caught,
    ):
        client.capabilities()
    assert route.call_count == 3
    assert len(fake_time.sleeps) == 2
    assert caught.value.status is None
    assert "ConnectError" in str(caught.value)
    assert "(gave up after 3 attempts in " in str(caught.value)  # a server that stays away
    assert caught.value.details["path"] == "/v1/training/capabilities"


@pytest.mark.parametrize(
    ("status", "type_"),
    [
        (400, "invalid_request"),
        (401, "unauthorized"),
        (404, "not_found"),
        (409, "seq_conflict"),
        (409, "run_not_active"),
        (422, "invalid_datum"),
    ],
)
def test_4xx_are_never_retried(mock, client, fake_time, status, type_):
    route = mock.post(OPS).mock(return_value=error_response(status, type_, "no"))
    with pytest.raises(errors.WhitneyError) as caught:
        client.run_operation("run-1", "export_lora", {}, seq_id=2)
    assert caught.value.status == status
    assert route.call_count == 1
    assert fake_time.sleeps == []


# -- error mapping ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "type_", "cls", "retryable"),
    [
        (400, "invalid_request", errors.InvalidRequest, False),
        (401, "unauthorized", errors.Unauthorized, False),
        (404, "not_found", errors.NotFound, False),
        (409, "seq_conflict", errors.SeqConflict, False),
        (409, "seq_gap", errors.SeqGap, False),
        (409, "run_not_active", errors.RunNotActive, False),
        (409, "idempotency_conflict", errors.IdempotencyConflict, False),
        (422, "invalid_datum", errors.InvalidDatum, False),
        (422, "unsupported_loss", errors.UnsupportedLoss, False),
        (422, "invalid_loss_config", errors.InvalidLossConfig, False),
        (422, "unsupported_base_model", errors.UnsupportedBaseModel, False),
        (429, "rate_limited", errors.RateLimited, True),
        (500, "internal", errors.InternalError, True),
        (503, "unavailable", errors.Unavailable, True),
    ],
)
def test_each_error_type_maps_to_its_class(mock, status, type_, cls, retryable):
    mock.get("/v1/training/runs/run-1").mock(
        return_value=error_response(status, type_, f"the {type_} message", {"field": "x"})
    )
    with (
        WhitneyClient(BASE, KEY, max_attempts=1) as client,
        pytest.raises(errors.WhitneyError) as caught,
    ):
        client.get_run("run-1")
    error = caught.value
    assert type(error) is cls
    assert (error.status, error.type, error.message) == (status, type_, f"the {type_} message")
    assert error.details == {"field": "x"}
    assert error.retryable is retryable
    assert str(error) == f"{status} {type_}: the {type_} message"


@pytest.mark.parametrize(
    ("response", "cls"),
    [
        (httpx.Response(502, text="<html><body>Bad Gateway</body></html>"), errors.ServerError),
        (httpx.Response(404, text="no such route"), errors.NotFound),
        (httpx.Response(409), errors.Conflict),
        (httpx.Response(422, json={"detail": [{"loc": ["body"]}]}), errors.Unprocessable),
        (httpx.Response(401, json={"error": "bad key"}), errors.Unauthorized),
        (httpx.Response(418, text="teapot"), errors.WhitneyError),
    ],
)
def test_a_non_json_error_body_still_gives_a_typed_error(mock, response, cls):
    mock.get("/v1/training/runs/run-1").mock(return_value=response)
    with (
        WhitneyClient(BASE, KEY, max_attempts=1) as client,
        pytest.raises(errors.WhitneyError) as caught,
    ):
        client.get_run("run-1")
    assert type(caught.value) is cls
    assert caught.value.status == response.status_code
    assert caught.value.message.startswith(f"HTTP {response.status_code}")


def test_an_unexpected_success_body_is_an_invalid_response(mock, client):
    mock.get("/v1/training/runs/run-1").respond(json={"run": "?"})
    with pytest.raises(errors.WhitneyError) as caught:
        client.get_run("run-1")
    assert caught.value.type == "invalid_response"
    assert "not a Run" in caught.value.message


# -- client-side validation -------------------------------------------------------------------


def test_an_invalid_payload_is_refused_before_anything_is_sent(mock, client):
    anything = mock.route()
    bad = fb_payload()
    bad["data"][0]["loss_inputs"]["weights"]["values"].append(1.0)
    with pytest.raises(errors.InvalidRequest) as caught:
        client.run_operation("run-1", "forward_backward", bad)
    assert caught.value.status is None
    assert "payload.data[0].loss_inputs.weights" in caught.value.message
    assert "has 4 values but shape [3]" in caught.value.message
    assert caught.value.details["errors"][0]["loc"] == "payload.data[0].loss_inputs.weights"
    assert anything.call_count == 0


@pytest.mark.parametrize(
    ("kind", "payload", "sampler_id", "needle"),
    [
        ("sample", sample_request([1], 1, max_tokens=4), None, "needs a sampler_id"),
        ("forward_backward", {}, "s-1", "is not a sampler operation"),
        ("train", {}, None, "unknown operation kind 'train'"),
        ("optim_step", {"optimizer": {"learning_rate": float("nan")}}, None, "learning_rate"),
        ("sample", {"prompt": {"token_ids": [1]}, "num_samples": 1}, "s-1", "sampling_params"),
        ("save_state", {"name": "a/b"}, None, "payload.name"),
        ("forward", [sft_datum([1], [2])], None, "payload must be a dict"),
    ],
)
def test_invalid_operations_are_refused_before_anything_is_sent(
    mock, client, kind, payload, sampler_id, needle
):
    anything = mock.route()
    with pytest.raises(errors.InvalidRequest, match=needle) as caught:
        client.execute("run-1", kind, payload, sampler_id=sampler_id)
    assert caught.value.status is None
    assert anything.call_count == 0


def test_create_run_is_validated_before_sending(mock, client):
    anything = mock.route()
    with pytest.raises(errors.InvalidRequest, match="provider"):
        client.create_run("sess-1", "openai", "tiny")
    with pytest.raises(errors.InvalidRequest, match="lora_rank"):
        client.create_run("sess-1", "local", "tiny", lora_rank=0)
    assert anything.call_count == 0


# -- operations ------------------------------------------------------------------------------


def test_execute_long_polls_until_terminal(mock, client):
    post = mock.post(OPS).respond(json=op_json(5, "optim_step", status="pending"))
    poll = mock.get(f"{OPS}/5").mock(
        side_effect=[
            httpx.Response(200, json=op_json(5, "optim_step", status="running")),
            httpx.Response(
                200,
                json=op_json(
                    5,
                    "optim_step",
                    result={"step": 1, "metrics": {"grad_norm": 0.5, "learning_rate": 1e-6}},
                    usage={"tokens": 42},
                ),
            ),
        ]
    )
    operation = client.execute(
        "run-1", "optim_step", {"optimizer": adamw_optimizer(1e-6)}, seq_id=5
    )
    assert operation.status == "succeeded"
    assert operation.usage == {"tokens": 42}
    assert operation.result["step"] == 1
    assert post.call_count == 1
    assert poll.call_count == 2
    assert [call.request.url.params["wait_s"] for call in poll.calls] == ["30", "30"]


def test_poll_wait_s_is_what_the_long_poll_asks_for(mock):
    mock.post(OPS).respond(json=op_json(1, status="running"))
    poll = mock.get(f"{OPS}/1").respond(json=op_json(1, result={"checkpoint": "c", "step": 0}))
    with WhitneyClient(BASE, KEY, poll_wait_s=5) as client:
        assert client.run_operation("run-1", "save_state", {}, seq_id=1)["checkpoint"] == "c"
    assert poll.calls.last.request.url.params["wait_s"] == "5"


def test_execute_times_out_with_operation_timeout(mock, client):
    mock.post(OPS).respond(json=op_json(2, status="pending"))
    poll = mock.get(f"{OPS}/2").respond(json=op_json(2, status="running"))
    with pytest.raises(errors.OperationTimeout) as caught:
        client.execute("run-1", "save_state", {}, seq_id=2, timeout=3.0)
    assert caught.value.retryable is True
    assert caught.value.details == {
        "run_id": "run-1",
        "seq_id": 2,
        "kind": "save_state",
        "status": "running",
    }
    assert poll.call_count >= 1
    # no long-poll ever asked the server to wait past the caller's deadline
    assert all(float(call.request.url.params["wait_s"]) <= 3.0 for call in poll.calls)


def test_a_failed_operation_raises_operation_failed_with_its_error(mock, client):
    error = {
        "type": "invalid_datum",
        "message": "data[0].loss_inputs.weights: has 2 values but shape [3]",
        "details": {"datum": 0, "tensor": "weights"},
    }
    mock.post(OPS).respond(json=op_json(6, "forward_backward", status="pending"))
    mock.get(f"{OPS}/6").respond(json=op_json(6, "forward_backward", status="failed", error=error))
    with pytest.raises(errors.OperationFailed) as caught:
        client.run_operation("run-1", "forward_backward", fb_payload(), seq_id=6)
    failure = caught.value
    assert failure.type == "invalid_datum"
    assert failure.message == error["message"]
    assert failure.details == {"datum": 0, "tensor": "weights"}
    assert failure.retryable is False
    assert (failure.run_id, failure.seq_id, failure.kind) == ("run-1", 6, "forward_backward")
    assert failure.operation.status == "failed"
    # Prefect moves exceptions between processes: the attributes survive pickling.
    copy = pickle.loads(pickle.dumps(failure))
    assert (type(copy), copy.type, copy.message, copy.details) == (
        errors.OperationFailed,
        "invalid_datum",
        error["message"],
        {"datum": 0, "tensor": "weights"},
    )
    assert copy.operation == failure.operation


def test_a_cancelled_operation_raises_operation_failed(mock, client):
    mock.post(OPS).respond(json=op_json(8, "export_lora", status="cancelled"))
    with pytest.raises(errors.OperationFailed) as caught:
        client.run_operation("run-1", "export_lora", {}, seq_id=8)
    assert caught.value.type == "operation_cancelled"
    assert caught.value.operation_status == "cancelled"
    assert "export_lora[seq=8]" in caught.value.message


def test_sampler_operations_use_the_sampler_route_and_the_runs_sequence(mock, client):
    mock.get("/v1/training/runs/run-1").respond(json=run_json(next_seq_id=3))
    run_ops = mock.post(OPS).mock(side_effect=echo_operation)
    sampler_ops = mock.post("/v1/training/runs/run-1/samplers/sampler%2F1/operations").mock(
        side_effect=echo_operation
    )
    request = sample_request([1, 2], 2, max_tokens=4)
    assert client.run_operation("run-1", "save_weights_for_sampler", {}) == {"seq": 3}
    assert client.sampler_operation("run-1", "sampler/1", "sample", request) == {"seq": 4}
    assert client.run_operation("run-1", "forward_backward", fb_payload()) == {"seq": 5}
    assert sent(sampler_ops.calls.last) == {"seq_id": 4, "kind": "sample", "payload": request}
    assert run_ops.call_count == 2


def test_seq_counter_is_lazy_and_follows_explicit_ids_and_sync(mock, client):
    run = mock.get("/v1/training/runs/run-1").mock(
        side_effect=[
            httpx.Response(200, json=run_json(next_seq_id=4)),
            httpx.Response(200, json=run_json(next_seq_id=20)),
        ]
    )
    mock.post(OPS).mock(side_effect=echo_operation)
    assert run.call_count == 0
    assert client.run_operation("run-1", "save_state", {}) == {"seq": 4}
    assert client.run_operation("run-1", "save_state", {}, seq_id=10) == {"seq": 10}
    assert client.run_operation("run-1", "save_state", {}) == {"seq": 11}
    assert client.reserve_seq_ids("run-1", 3) == range(12, 15)
    assert client.sync_seq("run-1") == 20
    assert client.run_operation("run-1", "save_state", {}) == {"seq": 20}
    assert run.call_count == 2


def test_a_failed_submit_makes_the_counter_resync(mock, client):
    run = mock.get("/v1/training/runs/run-1").respond(json=run_json(next_seq_id=9))
    mock.post(OPS).mock(
        side_effect=[error_response(409, "run_not_active", "run is cancelling"), echo_operation]
    )
    with pytest.raises(errors.RunNotActive):
        client.run_operation("run-1", "save_state", {})
    assert client.run_operation("run-1", "save_state", {}) == {"seq": 9}
    assert run.call_count == 2


def test_reserve_seq_ids_refuses_a_non_positive_count(client):
    with pytest.raises(ValueError):
        client.reserve_seq_ids("run-1", 0)


def test_concurrent_run_operations_get_distinct_gap_free_seq_ids(mock, client):
    def slow_run(request):
        time.sleep(0.05)  # let every thread pile up behind the first load of the counter
        return httpx.Response(200, json=run_json(next_seq_id=5))

    run = mock.get("/v1/training/runs/run-1").mock(side_effect=slow_run)
    posted = mock.post(OPS).mock(side_effect=echo_operation)
    barrier = threading.Barrier(8)
    results, failures = [], []
    lock = threading.Lock()

    def worker():
        barrier.wait()
        try:
            result = client.run_operation("run-1", "forward_backward", fb_payload())
        except Exception as error:  # noqa: BLE001 - reported below
            with lock:
                failures.append(error)
        else:
            with lock:
                results.append(result["seq"])

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert failures == []
    assert sorted(results) == list(range(5, 13))
    assert sorted(sent(call)["seq_id"] for call in posted.calls) == list(range(5, 13))
    assert run.call_count == 1


def test_concurrent_reservations_get_disjoint_contiguous_blocks(mock, client):
    mock.get("/v1/training/runs/run-1").respond(json=run_json(next_seq_id=1))
    blocks = []
    lock = threading.Lock()

    def worker():
        block = client.reserve_seq_ids("run-1", 3)
        with lock:
            blocks.append(block)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert all(len(block) == 3 and block.step == 1 for block in blocks)
    assert sorted(seq for block in blocks for seq in block) == list(range(1, 25))


# -- runs and sessions -----------------------------------------------------------------------


def test_wait_terminal_polls_the_run(mock, client, fake_time):
    route = mock.get("/v1/training/runs/run-1").mock(
        side_effect=[
            httpx.Response(200, json=run_json("cancelling")),
            httpx.Response(200, json=run_json("cancelling")),
            httpx.Response(200, json=run_json("cancelled")),
        ]
    )
    assert client.wait_terminal("run-1").status == "cancelled"
    assert route.call_count == 3
    assert fake_time.sleeps == [0.2, 0.4]


def test_wait_terminal_times_out(mock, client):
    mock.get("/v1/training/runs/run-1").respond(json=run_json("finishing"))
    with pytest.raises(errors.OperationTimeout, match="still 'finishing'"):
        client.wait_terminal("run-1", timeout=5.0)


def test_finish_and_cancel(mock, client):
    finish = mock.post("/v1/training/runs/run-1/finish").respond(json=run_json("finishing"))
    cancel = mock.post("/v1/training/runs/run-1/cancel").respond(json=run_json("cancelled"))
    assert client.finish("run-1").status == "finishing"
    assert client.cancel("run-1").status == "cancelled"
    assert finish.call_count == cancel.call_count == 1


def serves_no_leases(mock: respx.MockRouter) -> None:
    """The capabilities a client reads on its first session: no lease to renew."""
    mock.get("/v1/training/capabilities").respond(json={"api_version": "1", "providers": {}})


def test_open_session_sends_labels_and_keeps_its_idempotency_key_across_retries(mock, client):
    serves_no_leases(mock)
    route = mock.post("/v1/sessions").mock(
        side_effect=[
            httpx.ReadError("connection reset"),
            httpx.Response(200, json=session_json(labels={"prefect.flow-run-id": "abc"})),
        ]
    )
    session = client.open_session({"prefect.flow-run-id": "abc"})
    assert session.labels == {"prefect.flow-run-id": "abc"}
    first, second = route.calls
    assert sent(first) == {"labels": {"prefect.flow-run-id": "abc"}}
    key = first.request.headers["Idempotency-Key"]
    assert key and second.request.headers["Idempotency-Key"] == key
    assert first.request.content == second.request.content


def test_explicit_idempotency_keys_are_sent(mock, client):
    serves_no_leases(mock)
    sessions = mock.post("/v1/sessions").respond(json=session_json())
    runs = mock.post("/v1/training/runs").respond(json=run_json())
    client.open_session(idempotency_key="open-1")
    client.create_run("sess-1", "local", "tiny", idempotency_key="run-1-key")
    assert sessions.calls.last.request.headers["Idempotency-Key"] == "open-1"
    assert runs.calls.last.request.headers["Idempotency-Key"] == "run-1-key"
    assert sent(sessions.calls.last) == {"labels": {}}


def test_create_run_sends_the_full_body(mock, client):
    route = mock.post("/v1/training/runs").respond(json=run_json())
    run = client.create_run(
        "sess-1", "modal", "tiny", lora_rank=16, seed=3, role="critic", labels={"k": "v"}
    )
    assert run.run_id == "run-1"
    assert sent(route.calls.last) == {
        "session_id": "sess-1",
        "provider": "modal",
        "base_model": "tiny",
        "lora_rank": 16,
        "seed": 3,
        "role": "critic",
        "trainable": True,
        "from_checkpoint": None,
        "labels": {"k": "v"},
    }


def test_sessions(mock, client):
    listing = mock.get("/v1/sessions").respond(
        json={"sessions": [session_json(labels={"prefect.flow-run-id": "abc"})]}
    )
    one = mock.get("/v1/sessions/sess-1").respond(json=session_json(run_ids=["run-1"]))
    close = mock.post("/v1/sessions/sess-1/close").respond(json=session_json(status="closed"))
    sessions = client.list_sessions(label="prefect.flow-run-id:abc")
    assert [session.session_id for session in sessions] == ["sess-1"]
    assert listing.calls.last.request.url.params["label"] == "prefect.flow-run-id:abc"
    client.list_sessions()
    assert "label" not in listing.calls.last.request.url.params
    assert client.get_session("sess-1").run_ids == ["run-1"]
    assert client.close_session("sess-1").status == "closed"
    assert close.call_count == one.call_count == 1
    with pytest.raises(errors.InvalidRequest, match="KEY:VALUE"):
        client.list_sessions(label="no-colon")


def test_capabilities_and_journal(mock, client):
    mock.get("/v1/training/capabilities").respond(
        json={
            "api_version": "1",
            "providers": {
                "local": {
                    "base_models": ["tiny"],
                    "max_lora_rank": 64,
                    "run_operations": sorted(wire.RUN_OPERATION_KINDS),
                    "sampler_operations": ["logprobs", "sample"],
                }
            },
        }
    )
    journal = mock.get(OPS).respond(json={"operations": [op_json(3), op_json(4)]})
    assert client.capabilities().providers["local"].max_lora_rank == 64
    assert [op.seq_id for op in client.journal("run-1", after_seq=2, limit=10)] == [3, 4]
    params = journal.calls.last.request.url.params
    assert (params["after_seq"], params["limit"]) == ("2", "10")


def test_ids_cannot_escape_their_path_segment(mock, client):
    route = mock.get("/v1/training/runs/..%2Fsessions%3Fx%3D1").respond(json=run_json())
    client.get_run("../sessions?x=1")
    assert route.call_count == 1


def test_download_artifact_writes_the_file_atomically(mock, client, tmp_path):
    route = mock.get("/v1/artifacts/art-1").mock(
        side_effect=[httpx.ConnectError("reset"), httpx.Response(200, content=b"\x00adapter")]
    )
    target = client.download_artifact("art-1", tmp_path / "out" / "adapter.bin")
    assert target == tmp_path / "out" / "adapter.bin"
    assert target.read_bytes() == b"\x00adapter"
    assert route.call_count == 2
    into_dir = (
        client.download_artifact("art-1", tmp_path)
        if route.mock(return_value=httpx.Response(200, content=b"again"))
        else None
    )
    assert into_dir == tmp_path / "art-1"
    assert into_dir.read_bytes() == b"again"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["art-1", "out"]


def test_download_artifact_into_a_directory_stays_in_it(mock, client, tmp_path):
    mock.get("/v1/artifacts/..%2Fescape").respond(content=b"x")
    assert client.download_artifact("../escape", tmp_path) == tmp_path / "..%2Fescape"
    assert (tmp_path / "..%2Fescape").read_bytes() == b"x"
    with pytest.raises(ValueError, match="cannot name a file"):
        client.download_artifact("..", tmp_path)


def test_download_artifact_error_leaves_no_file(mock, client, tmp_path):
    mock.get("/v1/artifacts/missing").mock(
        return_value=error_response(404, "not_found", "no artifact missing")
    )
    with pytest.raises(errors.NotFound):
        client.download_artifact("missing", tmp_path / "adapter.bin")
    assert list(tmp_path.iterdir()) == []


# -- the key never leaks ---------------------------------------------------------------------


def exception_chain(error):
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def assert_no_key(error):
    for link in exception_chain(error):
        assert KEY not in str(link)
        assert KEY not in repr(link)
        assert KEY not in repr(link.args)
        assert KEY not in repr(getattr(link, "details", {}))
        request = getattr(link, "_request", None)
        assert request is None or KEY not in request.headers.get("Authorization", "")


def test_the_key_is_not_in_the_clients_repr(client):
    assert KEY not in repr(client)
    assert KEY not in str(client)
    assert KEY not in repr(vars(client))
    # the key is held once, as a secret, not in the pooled httpx client's default headers
    assert "authorization" not in client._transport._http.headers
    assert KEY not in repr(vars(client._transport))
    assert KEY not in repr(vars(client._transport._http))
    with pytest.raises(TypeError):
        pickle.dumps(client._transport._key)
    assert repr(client) == f"WhitneyClient(base_url={BASE!r})"


def test_the_key_is_not_in_a_transport_error_or_its_chain(mock, fake_time):
    route = mock.post(OPS).mock(side_effect=httpx.ConnectError)
    with (
        WhitneyClient(BASE, KEY, max_attempts=2) as client,
        pytest.raises(errors.TransportError) as caught,
    ):
        client.run_operation("run-1", "export_lora", {}, seq_id=1)
    # the httpx error respx raised carried the request, and so the Authorization header
    assert route.calls.last.request.headers["Authorization"] == f"Bearer {KEY}"
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None
    assert_no_key(caught.value)


def test_a_key_echoed_by_the_server_is_masked(mock):
    mock.get("/v1/training/runs/run-1").respond(
        401,
        json={
            "error": {
                "type": "unauthorized",
                "message": f"unknown key {KEY}",
                "details": {"key": KEY, "nested": [f"Bearer {KEY}"]},
            }
        },
    )
    with WhitneyClient(BASE, KEY) as client, pytest.raises(errors.Unauthorized) as caught:
        client.get_run("run-1")
    assert caught.value.message == "unknown key ***"
    assert caught.value.details == {"key": "***", "nested": ["Bearer ***"]}
    assert_no_key(caught.value)


def test_the_key_is_not_in_other_errors(mock, client):
    mock.post(OPS).respond(
        json=op_json(1, status="failed", error={"type": "internal", "message": f"boom {KEY}"})
    )
    with pytest.raises(errors.OperationFailed) as caught:
        client.run_operation("run-1", "save_state", {}, seq_id=1)
    assert_no_key(caught.value)
    with pytest.raises(errors.InvalidRequest) as caught:
        client.run_operation("run-1", "save_state", {"name": KEY + "/"})
    assert_no_key(caught.value)


def test_retry_logs_name_the_call_and_never_the_key(mock, client, caplog):
    caplog.set_level(logging.DEBUG)
    mock.post(OPS).mock(
        side_effect=[
            error_response(429, "rate_limited", "slow down", headers={"Retry-After": "7"}),
            httpx.ConnectError("reset"),
            echo_operation,
        ]
    )
    client.run_operation("run-1", "export_lora", {}, seq_id=1)
    retries = [r for r in caplog.records if r.name == "whitney.client"]
    assert [r.getMessage() for r in retries][0] == (
        f"Whitney POST {OPS} failed (HTTP 429) on attempt 1 (the server asked to wait); "
        "retrying in 7.00s"
    )
    assert (
        retries[1]
        .getMessage()
        .startswith(f"Whitney POST {OPS} failed (ConnectError) on attempt 2 of 6")
    )
    assert KEY not in caplog.text
    assert all(KEY not in repr(record.args) for record in caplog.records)
