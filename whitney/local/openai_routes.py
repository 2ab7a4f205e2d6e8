"""The OpenAI-compatible routes of the embedded server (docs/openai.md): `GET /v1/models`,
`POST /v1/chat/completions` and `POST /v1/completions`, with the same API keys, tenant caps
and body limit as every other route, refusals in OpenAI's error shape, and the sampling
stopped when the client goes away before its answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from whitney.errors import InternalError, OperationCancelled, WhitneyError
from whitney.local import openai_api
from whitney.local.fairness import TenantGate
from whitney.local.request_body import read_json
from whitney.local.service import WhitneyService

log = logging.getLogger("whitney.local.openai")

DISCONNECT_POLL_S = 0.1


def _json(content: Any, status: int = 200) -> Response:
    body = json.dumps(content, separators=(",", ":")).encode()
    return Response(body, status_code=status, media_type="application/json")


def _error(exc: WhitneyError) -> Response:
    status, body = openai_api.openai_error(exc)
    headers = {"Retry-After": f"{exc.retry_after:g}"} if exc.retry_after is not None else None
    response = _json(body, status)
    if headers:
        response.headers.update(headers)
    return response


def _sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def _until_done_or_gone(
    request: Request, work: asyncio.Future[Any], cancel: threading.Event
) -> Any:
    """`work`'s result; if the client disconnects first, `cancel` is set (the engine stops at
    its next token step) and OperationCancelled is raised once the work has stopped."""
    while True:
        done, _ = await asyncio.wait({work}, timeout=DISCONNECT_POLL_S)
        if done:
            return work.result()
        if await request.is_disconnected():
            cancel.set()
            with contextlib.suppress(OperationCancelled):
                await work
            raise OperationCancelled("the client went away: sampling stopped")


def install(app: FastAPI, service: WhitneyService, gate: TenantGate) -> None:
    """Add the OpenAI-compatible routes to `app`."""
    models = service.models
    limits = service.config.limits

    async def answer(
        request: Request,
        kind: type[openai_api.SamplingRequest],
        plan: Callable[..., Any],
        whole: Callable[..., Any],
        chunks: Callable[..., Any],
    ) -> Response:
        try:
            tenant = service.authenticate(request.headers.get("authorization"))
            with gate.admit(tenant):
                body = await read_json(request, limits.max_body_bytes)
                parsed = openai_api.parse(kind, body)
                served = await gate.run_sync(tenant, models.get, tenant, parsed.model)
                made = await gate.run_sync(tenant, plan, parsed, served, limits)
                cancel = threading.Event()
                work = asyncio.ensure_future(
                    gate.run_sync(tenant, openai_api.generate, served, made, cancel)
                )
                try:
                    choices, sampled = await _until_done_or_gone(request, work, cancel)
                except OperationCancelled:
                    models.cancelled_one()
                    return Response(status_code=499)
                if service.capture is not None:
                    texts = [choice.text for choice in choices]
                    await gate.run_sync(tenant, service.capture.record, made.exchange, texts)
        except WhitneyError as exc:
            return _error(exc)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return _error(InternalError("internal server error"))
        if parsed.stream:
            usage = bool((parsed.stream_options or {}).get("include_usage"))
            return _sse(chunks(parsed.model, made, served, choices, sampled, usage))
        return _json(whole(parsed.model, made, served, choices, sampled))

    @app.get("/v1/models", include_in_schema=False)
    async def list_models(request: Request) -> Response:
        try:
            tenant = service.authenticate(request.headers.get("authorization"))
            with gate.admit(tenant):
                data = await gate.run_sync(tenant, models.list, tenant)
        except WhitneyError as exc:
            return _error(exc)
        return _json({"object": "list", "data": data})

    @app.post("/v1/chat/completions", include_in_schema=False)
    async def chat_completions(request: Request) -> Response:
        return await answer(
            request,
            openai_api.ChatRequest,
            openai_api.plan_chat,
            openai_api.chat_answer,
            openai_api.chat_chunks,
        )

    @app.post("/v1/completions", include_in_schema=False)
    async def completions(request: Request) -> Response:
        return await answer(
            request,
            openai_api.CompletionRequest,
            openai_api.plan_completion,
            openai_api.completion_answer,
            openai_api.completion_chunks,
        )
