"""The OpenAI-compatible requests (`/v1/chat/completions`, `/v1/completions`): parsed, turned
into one Whitney `sample` of the model's frozen engine, and answered in OpenAI's shapes (a
whole answer, or the chunks of a stream that join to it). docs/openai.md is the contract."""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from whitney.errors import InvalidRequest, WhitneyError
from whitney.local.api_errors import from_validation_error
from whitney.local.limits import Limits, exceeded
from whitney.local.served_models import ServedModel
from whitney.renderers import check_messages

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
ENGINE_FIELDS = {"num_samples": "n", "prompt.token_ids": "prompt"}


class SamplingRequest(BaseModel):
    """What both routes take; unknown fields (`user`, `frequency_penalty`, ...) are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    n: int = Field(default=1, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stream: bool = False
    stream_options: dict[str, Any] | None = None


class ChatRequest(SamplingRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)


def openai_error(exc: WhitneyError) -> tuple[int, dict[str, Any]]:
    """The status and OpenAI-shaped body of a refusal: `{"error": {"message", "type",
    "param", "code"}}`; `param` is the field at fault, `code` the Whitney error type."""
    status = exc.status or type(exc).status or 500
    error_type = OPENAI_TYPES.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    param = exc.details.get("field")
    body = {"message": exc.message, "type": error_type, "param": param, "code": exc.type}
    return status, {"error": body}


def parse(kind: type[SamplingRequest], body: Any) -> Any:
    if not isinstance(body, dict):
        raise InvalidRequest("body: expected a JSON object", details={"field": "body"})
    try:
        return kind.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def _message_text(message: dict[str, Any], index: int) -> dict[str, Any]:
    """A message with its content as text (OpenAI's list of text parts joined)."""
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidRequest(
                    f"messages[{index}].content: only text parts are served",
                    details={"field": f"messages[{index}].content"},
                )
            texts.append(str(part.get("text", "")))
        content = "".join(texts)
    return {"role": message.get("role"), "content": content}


def _fail(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {message}", details={"field": field})


@dataclass(frozen=True)
class Plan:
    """One request made concrete: the prompt's tokens and the Whitney `sample` of it."""

    prompt: list[int]
    payload: dict[str, Any]
    seed: int
    stops: tuple[str, ...]
    stop_ids: frozenset[int]
    logprobs: bool
    exchange: dict[str, Any] | None  # what `serve --capture` keeps of the request


def plan_chat(request: ChatRequest, served: ServedModel, limits: Limits) -> Plan:
    if request.top_logprobs:
        raise _fail("top_logprobs", "alternatives are not served yet; use 0 or omit it")
    messages = [_message_text(m, i) for i, m in enumerate(request.messages)]
    try:
        checked = check_messages(messages)
    except ValueError as exc:
        field = str(exc).split(" ", 1)[0]
        raise InvalidRequest(str(exc), details={"field": field}) from None
    prompt = served.renderer.build_generation_prompt(checked)
    stop_ids = tuple(served.renderer.stop_tokens)
    max_tokens = request.max_completion_tokens or request.max_tokens
    field = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
    fields = ("messages", field)
    made = _plan(request, served, limits, prompt, stop_ids, max_tokens, fields, request.logprobs)
    return replace(made, exchange={"messages": checked})


def plan_completion(request: CompletionRequest, served: ServedModel, limits: Limits) -> Plan:
    if request.logprobs:
        raise _fail("logprobs", "alternatives are not served yet; use 0 for the tokens' logprobs")
    prompt_in: Any = request.prompt
    if isinstance(prompt_in, list) and prompt_in and isinstance(prompt_in[0], (str, list)):
        if len(prompt_in) != 1:
            raise _fail("prompt", "one prompt per request (send one request each)")
        prompt_in = prompt_in[0]
    if isinstance(prompt_in, str):
        bos = served.tokenizer.bos_id
        prompt = ([] if bos is None else [bos]) + served.tokenizer.encode(prompt_in)
    else:
        prompt = list(prompt_in)
    if not prompt:
        raise _fail("prompt", "must not be empty")
    max_tokens = request.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
    stop_ids = (served.tokenizer.eos_id,)
    wants = request.logprobs is not None
    fields = ("prompt", "max_tokens")
    made = _plan(request, served, limits, prompt, stop_ids, max_tokens, fields, wants)
    return replace(made, exchange={"prompt": prompt_in} if isinstance(prompt_in, str) else None)


def _plan(
    request: SamplingRequest,
    served: ServedModel,
    limits: Limits,
    prompt: list[int],
    stop_ids: tuple[int, ...],
    max_tokens: int | None,
    fields: tuple[str, str],
    logprobs: bool,
) -> Plan:
    """The `sample` of `prompt`; `fields` name the prompt and max_tokens in refusals."""
    prompt_field, max_field = fields
    if len(prompt) > limits.max_tokens_per_datum:
        raise exceeded(
            prompt_field, "max_tokens_per_datum", limits.max_tokens_per_datum, len(prompt)
        )
    room = served.max_positions - len(prompt)
    if room < 1:
        raise _fail(
            prompt_field,
            f"its {len(prompt)} tokens fill the model's {served.max_positions} positions",
        )
    if max_tokens is None:
        max_tokens = min(room, limits.max_tokens)
    if max_tokens > limits.max_tokens:
        raise exceeded(max_field, "max_tokens", limits.max_tokens, max_tokens)
    if max_tokens > room:
        raise _fail(
            max_field,
            f"{max_tokens} + the prompt's {len(prompt)} tokens exceed the model's "
            f"{served.max_positions} positions",
        )
    if request.n > limits.max_num_samples:
        raise exceeded("n", "max_num_samples", limits.max_num_samples, request.n)
    total = request.n * (len(prompt) + max_tokens)
    if total > limits.max_tokens_per_request:
        raise exceeded("n", "max_tokens_per_request", limits.max_tokens_per_request, total)
    stops = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    if len(stops) > 4 or any(not s for s in stops):
        raise _fail("stop", "at most 4 non-empty strings")
    params: dict[str, Any] = {"max_tokens": max_tokens, "stop_token_ids": list(stop_ids)}
    if request.temperature == 0:
        params["top_k"] = 1  # greedy: what a Whitney sample with top_k 1 decodes
    else:
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if request.top_k is not None:
            params["top_k"] = request.top_k
    if request.top_p is not None:
        params["top_p"] = request.top_p
    if request.seed is not None:
        params["seed"] = request.seed
    payload = {"prompt": {"token_ids": prompt}, "num_samples": request.n, "sampling_params": params}
    all_stop_ids = frozenset(stop_ids) | frozenset(served.eos_token_ids)
    return Plan(prompt, payload, secrets.randbits(63), stops, all_stop_ids, logprobs, None)


@dataclass(frozen=True)
class Choice:
    """One sampled sequence as the answer shows it: its text, the tokens that make it (a stop
    token or what follows a stop string left out), their logprobs and why it ended."""

    text: str
    tokens: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


def generate(served: ServedModel, plan: Plan, cancel: threading.Event) -> tuple[list[Choice], int]:
    """The choices of `plan` (one engine `sample`) and how many tokens were sampled."""
    try:
        output = served.sample(plan.payload, plan.seed, cancel)
        choices = [_choice(served, plan, seq) for seq in output.result["sequences"]]
        if plan.logprobs:
            choices = _with_logprobs(served, plan, choices, cancel)
    except WhitneyError as exc:
        raise _openai_fields(exc) from None
    return choices, int(output.usage.get("sampled_tokens", 0))


def _with_logprobs(
    served: ServedModel, plan: Plan, choices: list[Choice], cancel: threading.Event
) -> list[Choice]:
    """The choices with each token's logprob at temperature 1, from the engine's `logprobs`
    of prompt + tokens (Whitney's `logprobs` operation, whatever the sampling parameters)."""
    start = len(plan.prompt)
    rows = served.logprobs([plan.prompt + c.tokens for c in choices], cancel)
    return [
        replace(c, logprobs=[float(v) for v in row[start : start + len(c.tokens)]])
        for c, row in zip(choices, rows, strict=True)
    ]


def _openai_fields(exc: WhitneyError) -> WhitneyError:
    """An engine refusal naming the request's field as OpenAI spells it."""
    field = exc.details.get("field")
    if isinstance(field, str):
        name = ENGINE_FIELDS.get(field, field.removeprefix("sampling_params."))
        exc.details["field"] = name
    return exc


def _choice(served: ServedModel, plan: Plan, seq: dict[str, Any]) -> Choice:
    tokens, logprobs = list(seq["tokens"]), list(seq["logprobs"])
    stopped = seq["stop_reason"] == "stop"
    if stopped and tokens and tokens[-1] in plan.stop_ids:
        tokens, logprobs = tokens[:-1], logprobs[:-1]
    decode = served.tokenizer.decode
    text = decode(tokens)
    cut = min((i for i in (text.find(s) for s in plan.stops) if i >= 0), default=-1)
    if cut >= 0:
        text, stopped = text[:cut], True
        keep = next(k for k in range(len(tokens) + 1) if len(decode(tokens[:k])) >= cut)
        tokens, logprobs = tokens[:keep], logprobs[:keep]
    return Choice(text, tokens, logprobs, "stop" if stopped else "length")


def _usage(plan: Plan, sampled: int) -> dict[str, int]:
    prompt = len(plan.prompt)
    return {"prompt_tokens": prompt, "completion_tokens": sampled, "total_tokens": prompt + sampled}


def _token_entry(served: ServedModel, token: int, logprob: float) -> dict[str, Any]:
    text = served.tokenizer.decode([token])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}


def _completion_logprobs(
    served: ServedModel, tokens: list[int], lps: list[float], start: int
) -> dict[str, Any]:
    texts = [served.tokenizer.decode([t]) for t in tokens]
    offsets, at = [], start
    for text in texts:
        offsets.append(at)
        at += len(text)
    return {"tokens": texts, "token_logprobs": lps, "top_logprobs": None, "text_offset": offsets}


def chat_answer(
    model: str, plan: Plan, served: ServedModel, choices: list[Choice], sampled: int
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": {
                    "content": [
                        _token_entry(served, t, lp)
                        for t, lp in zip(c.tokens, c.logprobs, strict=True)
                    ]
                }
                if plan.logprobs
                else None,
                "finish_reason": c.finish_reason,
            }
            for i, c in enumerate(choices)
        ],
        "usage": _usage(plan, sampled),
    }


def completion_answer(
    model: str, plan: Plan, served: ServedModel, choices: list[Choice], sampled: int
) -> dict[str, Any]:
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "text": c.text,
                "logprobs": _completion_logprobs(served, c.tokens, c.logprobs, 0)
                if plan.logprobs
                else None,
                "finish_reason": c.finish_reason,
            }
            for i, c in enumerate(choices)
        ],
        "usage": _usage(plan, sampled),
    }


def deltas(served: ServedModel, choice: Choice) -> list[tuple[str, list[int], list[float]]]:
    """The choice's text in pieces, token by token, with the tokens and logprobs of each:
    a piece is emitted once the decoded tokens so far are a prefix of the whole text, so
    the pieces join to exactly `choice.text` (a character split over tokens comes whole)."""
    pieces: list[tuple[str, list[int], list[float]]] = []
    sent, start = 0, 0
    for k in range(1, len(choice.tokens) + 1):
        text = served.tokenizer.decode(choice.tokens[:k])
        if len(text) > sent and choice.text.startswith(text):
            pieces.append((text[sent:], choice.tokens[start:k], choice.logprobs[start:k]))
            sent, start = len(text), k
    if sent < len(choice.text) or start < len(choice.tokens):
        pieces.append((choice.text[sent:], choice.tokens[start:], choice.logprobs[start:]))
    return pieces


def chat_chunks(
    model: str, plan: Plan, served: ServedModel, choices: list[Choice], sampled: int, usage: bool
) -> list[dict[str, Any]]:
    """The chunks of a streamed chat answer, in order (the usage chunk if asked)."""
    ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(
        index: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None
    ) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    out = []
    for i, c in enumerate(choices):
        out.append(chunk(i, {"role": "assistant", "content": ""}))
        for text, tokens, lps in deltas(served, c):
            lp = (
                {"content": [_token_entry(served, t, v) for t, v in zip(tokens, lps, strict=True)]}
                if plan.logprobs
                else None
            )
            out.append(chunk(i, {"content": text}, lp))
        out.append(chunk(i, {}, None, c.finish_reason))
    if usage:
        out.append(
            {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": _usage(plan, sampled),
            }
        )
    return out


def completion_chunks(
    model: str, plan: Plan, served: ServedModel, choices: list[Choice], sampled: int, usage: bool
) -> list[dict[str, Any]]:
    """The chunks of a streamed completion, in order (the usage chunk if asked)."""
    ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(
        index: int, text: str, logprobs: Any = None, finish: str | None = None
    ) -> dict[str, Any]:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return {
            "id": ident,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    out = []
    for i, c in enumerate(choices):
        offset = 0
        for text, tokens, lps in deltas(served, c):
            lp = _completion_logprobs(served, tokens, lps, offset) if plan.logprobs else None
            out.append(chunk(i, text, lp))
            offset += len(text)
        out.append(chunk(i, "", None, c.finish_reason))
    if usage:
        out.append(
            {
                "id": ident,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [],
                "usage": _usage(plan, sampled),
            }
        )
    return out
