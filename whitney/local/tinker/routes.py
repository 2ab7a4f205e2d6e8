"""Tinker's REST routes (`/api/v1/...`) on the embedded server's app, beside Whitney's.

Each handler authenticates the `X-API-Key`, admits the call under the tenant's caps, reads
the body's bytes (measured as sent), and in one of the tenant's worker threads inflates zstd
(measured again), parses the JSON or the protobuf of `forward_backward` and runs `TinkerFront`:
one hop off the event loop per call. The answer of a training or sampling request (its
future) is held until the request is done, at most `post_wait_s`, as Whitney's POST of an
operation is: the SDK's `retrieve_future` then finds it done, and the SDK sends its next
request after it instead of while the engine computes. A refusal is Whitney's error body
with its status, except that a 409 is answered 400: the SDK retries a 409 for minutes, and a
conflict never resolves by waiting. An unexpected exception is a 500 with a short message.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import Response

from whitney.errors import InternalError, InvalidRequest, RateLimited, WhitneyError
from whitney.local.api_errors import error_object
from whitney.local.fairness import TenantGate
from whitney.local.operations import Waiting
from whitney.local.path_routes import add_path_route
from whitney.local.service import WhitneyService
from whitney.local.tinker import translate
from whitney.local.tinker.body import Sent, forward_backward_body, json_body, read_sent
from whitney.local.tinker.checkpoints import Checkpoints
from whitney.local.tinker.front import LONG_POLL_S, Done, Submitted, TinkerFront

log = logging.getLogger("whitney.local.tinker")

PREFIX = "/api/v1"
PROTOBUF = "application/x-protobuf"
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "parallel_fwdbwd_chunks": False,
    "proto_compress_fwdbwd": False,
    "use_pyqwest_transport": True,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}
"""The SDK's flags: chunks of a `forward_backward` are sent one after another, in `seq_id`
order; its protobuf body is sent plain, as Tinker's default asks (on loopback zstd would cost
a thread hop and a compressor on each side; a zstd body is still served, measured both ways);
custom losses run client-side (a `cross_entropy` with the loss's gradient as weights); the
SDK's HTTP clients use its pyqwest transport, which builds in a fraction of the time of an
httpx client and its SSL context (the SDK builds one per connection pool, two of them at the
first train and sample requests)."""


def _json(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(content, separators=(",", ":")).encode()
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _refusal(exc: WhitneyError) -> Response:
    """Whitney's error body, status (409 answered 400) and Retry-After."""
    status = exc.status or type(exc).status or InternalError.status
    headers = None if exc.retry_after is None else {"Retry-After": f"{exc.retry_after:g}"}
    return _json({"error": error_object(exc)}, 400 if status == 409 else status, headers)


def _refuse_delete(tenant: str) -> None:
    raise translate.refused("checkpoint_id", "deleting checkpoints (the server keeps them)")


Call = Callable[..., Awaitable[Response]]
"""`call(request, fn, *args, body="json")`: see `_caller`."""


def install(app: FastAPI, service: WhitneyService, gate: TenantGate) -> None:
    """Mount the Tinker routes on `app`."""
    front = TinkerFront(service)
    call = _caller(service, gate, front)
    _install_sessions(app, front, call)
    _install_checkpoints(app, Checkpoints(service), call)
    _install_futures(app, service, gate, front)


def _caller(service: WhitneyService, gate: TenantGate, front: TinkerFront) -> Call:
    """The one way a Tinker handler runs its call: authenticate the `X-API-Key`, admit, read
    the body (`body`: "json", "proto" or None), run `fn(tenant, *args[, body])` in a thread,
    and hold a submitted request until its last operation is done."""
    max_bytes = service.config.limits.max_body_bytes

    async def hold(tenant: str, pending: Waiting | None) -> None:
        """Until a request's last operation is done (at most `post_wait_s`), counted as one of
        the tenant's long-polls; at once when it is done or they are all taken."""
        if pending is None:
            return
        try:
            with gate.admit(tenant, long_poll=True):
                await service.operations.wait(pending)
        except RateLimited:
            pass  # the SDK's retrieve_future waits instead

    async def call(
        request: Request, fn: Callable[..., Any], *args: Any, body: str | None = "json"
    ) -> Response:
        try:
            tenant = front.authenticate(request.headers.get("x-api-key"))
            with gate.admit(tenant):
                if body is None:
                    result = await gate.run_sync(tenant, fn, tenant, *args)
                else:
                    sent = await read_sent(request, max_bytes)
                    parse = json_body if body == "json" else forward_backward_body
                    # parsed in the thread that runs the call: one hop off the event loop
                    result = await gate.run_sync(tenant, lambda: fn(tenant, *args, parse(sent)))
            if isinstance(result, Submitted):
                await hold(tenant, result.pending)
                result = result.future
        except WhitneyError as exc:
            return _refusal(exc)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return _refusal(InternalError("internal server error"))
        return _json(result)

    return call


def _by_path(
    app: FastAPI,
    call: Call,
    method: str,
    path: str,
    name: str,
    fn: Callable[..., Any],
    body: str | None = None,
) -> None:
    """`method path` answering `call(request, fn, *its path parameters, body=body)`."""

    def answer(request: Request, *ids: str) -> Awaitable[Response]:
        return call(request, fn, *ids, body=body)

    add_path_route(app, method, path, name, answer, include_in_schema=False)


def _install_sessions(app: FastAPI, front: TinkerFront, call: Call) -> None:
    """The client's configuration, the capabilities, and the sessions', models' and samplers'
    calls."""
    by_path = functools.partial(_by_path, app, call)

    @app.get(f"{PREFIX}/healthz", include_in_schema=False)
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @app.post(f"{PREFIX}/client/config", include_in_schema=False)
    async def client_config(request: Request) -> Response:
        return await call(request, lambda tenant, body: CLIENT_CONFIG)

    @app.post(f"{PREFIX}/client/dynamic_config", include_in_schema=False)
    async def dynamic_config(request: Request) -> Response:
        config = {"refresh_interval_sec": 300, "sample_cancel_enabled": False}
        return await call(request, lambda tenant, body: config)

    @app.get(f"{PREFIX}/get_server_capabilities", include_in_schema=False)
    async def capabilities(request: Request) -> Response:
        return await call(request, lambda tenant: front.capabilities(), body=None)

    @app.post(f"{PREFIX}/telemetry", include_in_schema=False)
    async def telemetry(request: Request) -> Response:
        return await call(request, lambda tenant, body: {"status": "accepted"})

    routes: dict[str, Callable[..., Any]] = {
        "create_session": front.create_session,
        "session_heartbeat": front.heartbeat,
        "create_model": front.create_model,
        "get_info": front.get_info,
        "unload_model": front.unload_model,
        "optim_step": front.optim_step,
        "save_weights": front.save_weights,
        "save_weights_for_sampler": front.save_weights_for_sampler,
        "load_weights": front.load_weights,
        "save_weights_external": front.save_weights_external,
        "create_sampling_session": front.create_sampling_session,
        "asample": front.asample,
    }

    for name, fn in routes.items():
        by_path("POST", f"{PREFIX}/{name}", f"tinker_{name}", fn, "json")

    @app.post(f"{PREFIX}/forward_backward", include_in_schema=False)
    async def forward_backward(request: Request) -> Response:
        content_type = request.headers.get("content-type", "")
        if not content_type.startswith(PROTOBUF):
            return _refusal(
                InvalidRequest(
                    f"Content-Type: {content_type[:64]!r} is not served for forward_backward "
                    f"(the SDK sends {PROTOBUF})",
                    details={"field": "Content-Type"},
                )
            )
        return await call(request, front.forward_backward, body="proto")

    by_path(
        "POST", f"{PREFIX}/sessions/{{session_id}}/finish", "finish_session", front.finish_session
    )
    by_path("GET", f"{PREFIX}/samplers/{{sampling_session_id}}", "get_sampler", front.get_sampler)


def _install_checkpoints(app: FastAPI, checkpoints: Checkpoints, call: Call) -> None:
    """The training runs, their checkpoints and the signed downloads."""
    by_path = functools.partial(_by_path, app, call)
    runs = f"{PREFIX}/training_runs"
    checkpoint = f"{runs}/{{run_id}}/checkpoints/{{kind}}/{{name}}"

    @app.get(runs, include_in_schema=False)
    async def training_runs(request: Request, limit: int = 20, offset: int = 0) -> Response:
        if not (1 <= limit <= 1000 and offset >= 0):
            return _refusal(translate.bad("limit", "limit within 1..1000, offset >= 0"))
        return await call(request, checkpoints.training_runs, limit, offset, body=None)

    by_path("GET", f"{runs}/{{run_id}}", "training_run", checkpoints.training_run)
    by_path("GET", f"{runs}/{{run_id}}/checkpoints", "list_checkpoints", checkpoints.checkpoints)

    @app.get(f"{checkpoint}/external_weights_urls", include_in_schema=False)
    async def external_urls(request: Request, run_id: str, kind: str, name: str) -> Response:
        base_url = str(request.base_url).rstrip("/")
        fn = checkpoints.external_urls
        return await call(request, fn, run_id, kind, name, base_url, body=None)

    @app.put(f"{checkpoint}/ttl", include_in_schema=False)
    async def checkpoint_ttl(request: Request, run_id: str, kind: str, name: str) -> Response:
        """Accepted: the embedded server keeps every checkpoint, with no expiry."""
        return await call(request, lambda tenant, body: {})

    @app.delete(checkpoint, include_in_schema=False)
    async def delete_checkpoint(request: Request, run_id: str, kind: str, name: str) -> Response:
        return await call(request, _refuse_delete, body=None)

    @app.get(f"{PREFIX}/external_weights/{{token}}/{{member:path}}", include_in_schema=False)
    async def external_file(token: str, member: str) -> Response:
        """A signed URL's file: the token is the credential (the SDK sends no key)."""
        try:
            data = await anyio.to_thread.run_sync(checkpoints.file, token, member)
        except WhitneyError as exc:
            return _refusal(exc)
        return Response(data, media_type="application/octet-stream")


def _install_futures(
    app: FastAPI, service: WhitneyService, gate: TenantGate, front: TinkerFront
) -> None:
    """`retrieve_future`: a request's answer, held up to `LONG_POLL_S` as a long-poll."""
    max_bytes = service.config.limits.max_body_bytes

    def first_poll(tenant: str, sent: Sent) -> tuple[str, Done | Waiting | None]:
        """The future's id and its first answer, held up to `LONG_POLL_S`."""
        request_id = json_body(sent).get("request_id")
        if not isinstance(request_id, str):
            raise InvalidRequest("request_id: expected a string", details={"field": "request_id"})
        return request_id, front.poll(tenant, request_id, LONG_POLL_S)

    @app.post(f"{PREFIX}/retrieve_future", include_in_schema=False)
    async def retrieve_future(request: Request) -> Response:
        try:
            tenant = front.authenticate(request.headers.get("x-api-key"))
            with gate.admit(tenant, long_poll=True):
                sent = await read_sent(request, max_bytes)
                deadline = time.monotonic() + LONG_POLL_S
                request_id, answer = await gate.run_sync(tenant, first_poll, tenant, sent)
                while isinstance(answer, Waiting):
                    await service.operations.wait(answer)
                    wait_s = max(0.0, deadline - time.monotonic())
                    answer = await gate.run_sync(tenant, front.poll, tenant, request_id, wait_s)
        except WhitneyError as exc:
            return _refusal(exc)
        except Exception:
            log.exception("retrieve_future failed")
            return _refusal(InternalError("internal server error"))
        if not isinstance(answer, Done):
            return _json({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        if answer.proto is not None:
            return Response(answer.proto, media_type=PROTOBUF)
        return _json(answer.json)
