"""The OpenAI-compatible routes of the embedded server (docs/openai.md): `GET /v1/models`,
`POST /v1/chat/completions` and `POST /v1/completions`, with the same API keys, tenant caps
and body limit as every other route, refusals in OpenAI's error shape, streams sent as the
engine samples their tokens, and the sampling stopped when the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from whitney.errors import InternalError, InvalidRequest, NotFound, OperationCancelled, WhitneyError
from whitney.local import openai_api
from whitney.local.fairness import TenantGate
from whitney.local.openai_decode import Piece
from whitney.local.path_routes import add_path_route
from whitney.local.request_body import read_json
from whitney.local.service import WhitneyService

log = logging.getLogger("whitney.local.openai")

DISCONNECT_POLL_S = 0.1
WHITNEY_SECTIONS = ("training", "sessions", "artifacts")  # the training API's parts of /v1/
# each sampling route's request model, plan, whole answer and stream
CHAT = (openai_api.ChatRequest, openai_api.plan_chat, openai_api.chat_answer, openai_api.ChatStream)
COMPLETION = (
    openai_api.CompletionRequest,
    openai_api.plan_completion,
    openai_api.completion_answer,
    openai_api.CompletionStream,
)


def _json(content: Any, status: int = 200) -> Response:
    body = json.dumps(content, separators=(",", ":")).encode()
    return Response(body, status_code=status, media_type="application/json")


def error_response(exc: WhitneyError) -> Response:
    """A refusal in OpenAI's shape, with its status (and Retry-After)."""
    status, body = openai_api.openai_error(exc)
    headers = {"Retry-After": f"{exc.retry_after:g}"} if exc.retry_after is not None else None
    response = _json(body, status)
    if headers:
        response.headers.update(headers)
    return response


def _event(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


async def _until_done_or_gone(
    request: Request, work: asyncio.Future[Any], cancel: threading.Event
) -> Any:
    """`work`'s result; if the client disconnects first, `cancel` is set (the engine stops at
    its next token step) and OperationCancelled is raised."""
    while True:
        done, _ = await asyncio.wait({work}, timeout=DISCONNECT_POLL_S)
        if done:
            return work.result()
        if await request.is_disconnected():
            cancel.set()
            raise OperationCancelled("the client went away: sampling stopped")


def is_openai_path(path: str) -> bool:
    """A path under /v1/ outside the training API's (whose unknown routes answer in its shape)."""
    parts = path.split("/")
    return len(parts) > 2 and parts[1] == "v1" and parts[2] not in WHITNEY_SECTIONS


def route_error(method: str, path: str, status: int) -> Response:
    """An unknown route (404) or method (405) under /v1/ outside the training API's parts,
    in OpenAI's shape."""
    if status == 404:
        exc: WhitneyError = NotFound(
            f"no such route: {method} {path} (this server's OpenAI-compatible routes are "
            "GET /v1/models, POST /v1/chat/completions and POST /v1/completions)"
        )
    else:
        exc = InvalidRequest(f"method {method} not allowed on {path}", status=status)
    return error_response(exc)


def install(app: FastAPI, service: WhitneyService, gate: TenantGate) -> None:
    """Add the OpenAI-compatible routes to `app`."""
    models = service.models
    limits = service.config.limits

    def finished(admission: contextlib.ExitStack, work: asyncio.Future[Any]) -> None:
        """The request's engine work has stopped: its admission ends; a cancelled one is
        counted (it stopped before its last token)."""
        admission.close()
        if not work.cancelled() and isinstance(work.exception(), OperationCancelled):
            models.cancelled_one()
            log.info("a request's sampling stopped at a token step: its client went away")

    async def capture(tenant: str, plan: openai_api.Plan, answer: openai_api.Answer) -> None:
        if service.capture is None:
            return
        for number, exchange in enumerate(plan.exchanges):
            texts = answer.texts(number, plan.n)
            await gate.run_sync(tenant, service.capture.record, exchange, texts)

    async def answer(
        kind: type[openai_api.SamplingRequest],
        plan: Callable[..., openai_api.Plan],
        whole: Callable[..., dict[str, Any]],
        stream: type[openai_api.ChatStream],
        request: Request,
    ) -> Response:
        admission = contextlib.ExitStack()
        try:
            tenant = service.authenticate(request.headers.get("authorization"))
            admission.enter_context(gate.admit(tenant))
            body = await read_json(request, limits.max_body_bytes)
            parsed = openai_api.parse(kind, body)
            served = await gate.run_sync(tenant, models.get, tenant, parsed.model)
            made = await gate.run_sync(tenant, plan, parsed, served, limits)
            cancel = threading.Event()
            pieces: asyncio.Queue[list[Piece]] = asyncio.Queue()
            sink = _threadsafe(pieces) if parsed.stream else None
            work = asyncio.ensure_future(
                gate.run_sync(tenant, openai_api.generate, served, made, cancel, sink)
            )
            work.add_done_callback(functools.partial(finished, admission.pop_all()))
            if parsed.stream:
                chunks = stream(parsed.model, made, served)
                usage = bool((parsed.stream_options or {}).get("include_usage"))
                keep = functools.partial(capture, tenant, made)
                events = _stream(work, pieces, chunks, usage, keep)
                return EventStream(events, work, cancel)
            try:
                answered = await _until_done_or_gone(request, work, cancel)
            except OperationCancelled:
                return Response(status_code=499)
            await capture(tenant, made, answered)
            return _json(whole(parsed.model, made, served, answered))
        except WhitneyError as exc:
            return error_response(exc)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(InternalError("internal server error"))
        finally:
            admission.close()

    @app.get("/v1/models", include_in_schema=False)
    async def list_models(request: Request) -> Response:
        try:
            tenant = service.authenticate(request.headers.get("authorization"))
            with gate.admit(tenant):
                data = await gate.run_sync(tenant, models.list, tenant)
        except WhitneyError as exc:
            return error_response(exc)
        return _json({"object": "list", "data": data})

    for path, name, parts in (
        ("/v1/chat/completions", "chat_completions", CHAT),
        ("/v1/completions", "completions", COMPLETION),
    ):
        answer_one = functools.partial(answer, *parts)
        add_path_route(app, "POST", path, name, answer_one, include_in_schema=False)


class EventStream(StreamingResponse):
    """Server-sent events whose engine work is cancelled when the response ends before it
    (the client went away, or the send failed), however the events' generator was left."""

    def __init__(
        self, events: AsyncIterator[bytes], work: asyncio.Future[Any], cancel: threading.Event
    ) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.work, self.cancel = work, cancel

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.work.done():
                self.cancel.set()


def _threadsafe(queue: asyncio.Queue[list[Piece]]) -> Callable[[list[Piece]], None]:
    """A sink the engine's thread hands each step's pieces to, in order, on the event loop."""
    loop = asyncio.get_running_loop()

    def put(pieces: list[Piece]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, pieces)

    return put


async def _stream(
    work: asyncio.Future[Any],
    pieces: asyncio.Queue[list[Piece]],
    chunks: openai_api.ChatStream,
    usage: bool,
    capture: Callable[[openai_api.Answer], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """The server-sent events of a stream, each piece sent as the engine makes it."""
    waiting: asyncio.Future[list[Piece]] | None = None
    try:
        for chunk in chunks.opening():
            yield _event(chunk)
        while True:
            waiting = asyncio.ensure_future(pieces.get())
            await asyncio.wait({waiting, work}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                waiting.cancel()
                break
            for chunk in chunks.pieces(waiting.result()):
                yield _event(chunk)
        while not pieces.empty():  # the last steps' pieces, queued before the work ended
            for chunk in chunks.pieces(pieces.get_nowait()):
                yield _event(chunk)
        failure = work.exception()
        if isinstance(failure, WhitneyError):
            yield _event(openai_api.openai_error(failure)[1])
            return
        if failure is not None:
            log.error("a stream failed", exc_info=failure)
            yield _event(openai_api.openai_error(InternalError("internal server error"))[1])
            return
        answer = work.result()
        await capture(answer)
        for chunk in chunks.closing(answer, usage):
            yield _event(chunk)
        yield _event("[DONE]")
    finally:
        if waiting is not None:
            waiting.cancel()
