"""The HTTP face of the embedded Whitney (FastAPI): every route of docs/api.md.

Handlers authenticate, admit the call under the tenant's caps (`fairness.TenantGate`: 429
`rate_limited` past them), parse, run the service call in one of the tenant's worker threads,
await on the event loop any wait it asks for (a long-poll holds no thread), and answer JSON.
Every refusal is `{"error": {"type", "message", "details"}}`; FastAPI's own validation and
routing errors are rewritten into that body; an unexpected exception is logged here and
answered 500 `internal` with a short message, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio.to_thread
from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from whitney import wire
from whitney.errors import (
    InternalError,
    InvalidDatum,
    InvalidRequest,
    NotFound,
    Unavailable,
    WhitneyError,
)
from whitney.local import openai_routes, openapi
from whitney.local.api_errors import error_object
from whitney.local.config import MAX_WAIT_S
from whitney.local.fairness import TenantGate
from whitney.local.operations import RawJson, Waiting
from whitney.local.path_routes import add_path_route
from whitney.local.request_body import read_json
from whitney.local.service import WhitneyService
from whitney.local.tinker import routes as tinker_routes

log = logging.getLogger("whitney.local.app")

THREADPOOL_TOKENS = 256
_CLOSE_MARKER = "whitney-fault-dropped-connection"


def _json(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    if isinstance(content, RawJson):
        body = content.text.encode()
    else:
        body = json.dumps(content, separators=(",", ":")).encode()
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def error_response(exc: WhitneyError) -> Response:
    """The one rendering of a refusal: `{"error": ...}` with the status the error names, else
    its class's, and Retry-After when the error has one."""
    headers = None
    if exc.retry_after is not None:
        headers = {"Retry-After": f"{exc.retry_after:g}"}
    status = exc.status or type(exc).status or InternalError.status
    return _json({"error": error_object(exc)}, status, headers)


def _internal() -> Response:
    return error_response(InternalError("internal server error"))


class _DroppedConnection(Response):
    """A fault: headers promise a body that never comes, then the connection closes."""

    def __init__(self) -> None:
        super().__init__(b"")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"4096"),
                    (b"x-whitney-fault", _CLOSE_MARKER.encode()),
                ],
            }
        )
        # returning without the body makes uvicorn close the transport


class _DroppedConnectionLogFilter(logging.Filter):
    """uvicorn reports an injected dropped connection as an error; it is on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "returned without completing response" not in record.getMessage()


def install_log_filter() -> None:
    target = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DroppedConnectionLogFilter) for f in target.filters):
        target.addFilter(_DroppedConnectionLogFilter())


class LatencyMiddleware:
    """A fault: every answer is delayed by `delay_s`."""

    def __init__(self, app: ASGIApp, delay_s: float) -> None:
        self.app = app
        self.delay_s = delay_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        delayed = False

        async def send_delayed(message: Message) -> None:
            nonlocal delayed
            if message["type"] == "http.response.start" and not delayed:
                delayed = True
                await asyncio.sleep(self.delay_s)
            await send(message)

        await self.app(scope, receive, send_delayed)


def _field_from_loc(loc: tuple[Any, ...]) -> str:
    parts = [p for p in loc if p not in ("path", "query", "header", "body")]
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "request"


async def _validation(_: Request, exc: RequestValidationError) -> Response:
    """FastAPI's validation error as the wire's refusal naming the field (and the datum)."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = tuple(first.get("loc", ()))
    field = _field_from_loc(loc)
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    details: dict[str, Any] = {"field": field}
    if "data" in loc:
        index = loc.index("data")
        if index + 1 < len(loc) and isinstance(loc[index + 1], int):
            details["datum"] = loc[index + 1]
            if "loss_inputs" in loc and loc.index("loss_inputs") + 1 < len(loc):
                details["tensor"] = loc[loc.index("loss_inputs") + 1]
            return error_response(InvalidDatum(f"{field}: {message}", details=details))
    return error_response(InvalidRequest(f"{field}: {message}", details=details))


async def _http(request: Request, exc: StarletteHTTPException) -> Response:
    """An unknown route or method: in OpenAI's shape under its paths, else the wire's."""
    if openai_routes.is_openai_path(request.url.path):
        return openai_routes.route_error(request.method, request.url.path, exc.status_code)
    if exc.status_code == 404:
        return error_response(NotFound("no such route"))
    if exc.status_code == 405:
        return error_response(InvalidRequest("method not allowed on this route", status=405))
    return error_response(InvalidRequest(str(exc.detail), status=exc.status_code))


def create_app(service: WhitneyService) -> FastAPI:
    """The FastAPI app serving `service`."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # type: ignore[no-untyped-def]
        anyio.to_thread.current_default_thread_limiter().total_tokens = THREADPOOL_TOKENS
        yield

    app = FastAPI(
        title="Whitney (embedded)",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    openapi.install(app)
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
    gate = TenantGate(service.config.limits)
    call = _caller(service, gate)
    _install_resources(app, service, call)
    _install_operations(app, service, call)
    openai_routes.install(app, service, gate)
    tinker_routes.install(app, service, gate)

    if service.faults.latency_s > 0:
        app.add_middleware(LatencyMiddleware, delay_s=service.faults.latency_s)
    install_log_filter()
    return app


Call = Callable[..., Awaitable[Response]]
"""`call(request, fn, *args, body=False, wrap=None, long_poll=False)`: see `_caller`."""


def _caller(service: WhitneyService, gate: TenantGate) -> Call:
    """The one way a training-API handler runs its service call."""

    async def call(
        request: Request,
        fn: Callable[..., Any],
        *args: Any,
        body: bool = False,
        wrap: Callable[[Any], Response] | None = None,
        long_poll: bool = False,
    ) -> Response:
        """Authenticate, admit (against the tenant's long-poll cap if `long_poll`, else its
        request cap), parse the body if asked, and run `fn(tenant, *args[, body])` in a thread;
        a `Waiting` answer is awaited on the event loop, then rendered in a thread."""
        try:
            tenant = service.authenticate(request.headers.get("authorization"))
            with gate.admit(tenant, long_poll):
                call_args: list[Any] = [tenant, *args]
                if body:
                    max_bytes = service.config.limits.max_body_bytes
                    call_args.append(await read_json(request, max_bytes))
                result = await gate.run_sync(tenant, fn, *call_args)
                if isinstance(result, Waiting):
                    await service.operations.wait(result)
                    result = await gate.run_sync(tenant, service.operations.render_waited, result)
        except WhitneyError as exc:
            return error_response(exc)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return _internal()
        return _json(result) if wrap is None else wrap(result)

    return call


def _install_resources(app: FastAPI, service: WhitneyService, call: Call) -> None:
    """The capabilities, sessions and runs routes."""

    @app.get("/v1/training/capabilities")
    async def capabilities(request: Request) -> Response:
        return await call(request, lambda tenant: service.capabilities())

    @app.post("/v1/sessions")
    async def create_session(request: Request) -> Response:
        key = request.headers.get("idempotency-key")
        return await call(request, lambda t, b: service.sessions.create(t, b, key), body=True)

    @app.get("/v1/sessions")
    async def list_sessions(request: Request) -> Response:
        labels = request.query_params.getlist("label")
        return await call(request, service.sessions.find, labels)

    def by_path(method: str, path: str, name: str, fn: Callable[..., Any]) -> None:
        add_path_route(app, method, path, name, lambda request, *ids: call(request, fn, *ids))

    by_path("GET", "/v1/sessions/{session_id}", "get_session", service.sessions.get)
    by_path("POST", "/v1/sessions/{session_id}/close", "close_session", service.sessions.close)
    by_path("POST", "/v1/sessions/{session_id}/heartbeat", "heartbeat", service.sessions.heartbeat)

    @app.post("/v1/training/runs")
    async def create_run(request: Request) -> Response:
        key = request.headers.get("idempotency-key")
        return await call(request, lambda t, b: service.runs.create(t, b, key), body=True)

    by_path("GET", "/v1/training/runs/{run_id}", "get_run", service.runs.get)
    by_path("POST", "/v1/training/runs/{run_id}/finish", "finish_run", service.runs.finish)
    by_path("POST", "/v1/training/runs/{run_id}/cancel", "cancel_run", service.runs.cancel)


def _install_operations(app: FastAPI, service: WhitneyService, call: Call) -> None:
    """The operations routes (with the injected faults around a submit) and the artifacts'."""
    faults = service.faults

    def submit_operation(tenant: str, run_id: str, sampler_id: str | None, body: Any) -> Any:
        if faults.fail_before():
            raise Unavailable(
                "injected fault: unavailable before journaling",
                details={"fault": "fail_before"},
                retry_after=0,
            )
        return service.operations.submit(tenant, run_id, sampler_id, body)

    def answer_operation(op: Any) -> Response:
        drop = faults.drop_after_commit()
        if drop == "close":
            return _DroppedConnection()
        if drop == "unavailable":
            return error_response(
                Unavailable(
                    "injected fault: answer dropped after commit",
                    details={"fault": "drop_after_commit"},
                    retry_after=0,
                )
            )
        return _json(op)

    async def submit(request: Request, run_id: str, sampler_id: str | None) -> Response:
        return await call(
            request, submit_operation, run_id, sampler_id, body=True, wrap=answer_operation
        )

    runs = "/v1/training/runs/{run_id}"
    add_path_route(
        app, "POST", f"{runs}/operations", "run_operation", lambda r, run: submit(r, run, None)
    )
    add_path_route(
        app, "POST", f"{runs}/samplers/{{sampler_id}}/operations", "sampler_operation", submit
    )

    @app.get("/v1/training/runs/{run_id}/operations/{seq_id}")
    async def get_operation(
        request: Request,
        run_id: str,
        seq_id: Annotated[int, Path(ge=1, lt=wire.SEQ_ID_LIMIT)],
        wait_s: float = 0.0,
    ) -> Response:
        if not 0 <= wait_s < float("inf"):
            return error_response(
                InvalidRequest(f"wait_s: must be >= 0, got {wait_s}", details={"field": "wait_s"})
            )
        wait_s = min(wait_s, MAX_WAIT_S)
        return await call(
            request, service.operations.get, run_id, seq_id, wait_s, long_poll=wait_s > 0
        )

    @app.get("/v1/training/runs/{run_id}/operations")
    async def list_operations(
        request: Request,
        run_id: str,
        after_seq: Annotated[int, Query(ge=0, lt=wire.SEQ_ID_LIMIT)] = 0,
        limit: int | None = None,
    ) -> Response:
        return await call(request, service.operations.page, run_id, after_seq, limit)

    @app.get("/v1/artifacts/{artifact_id}")
    async def get_artifact(request: Request, artifact_id: str) -> Response:
        def file(found: tuple[Any, dict[str, Any]]) -> Response:
            path, artifact = found
            return FileResponse(
                path,
                media_type="application/x-tar",
                filename=f"{artifact_id}.tar",
                headers={"X-Whitney-SHA256": artifact["sha256"]},
            )

        return await call(request, service.files.artifact_path, artifact_id, wrap=file)
