"""The OpenAI-compatible requests (`/v1/chat/completions`, `/v1/completions`): parsed, turned
into one engine `sample` of the model's frozen engine (a Whitney `sample` per prompt), and
answered in OpenAI's shapes: a whole answer, or the chunks of a stream sent as the tokens are
sampled, which join to it. docs/openai.md is the contract."""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from whitney.errors import InvalidRequest, WhitneyError
from whitney.local.api_errors import from_validation_error
from whitney.local.limits import Limits, exceeded
from whitney.local.openai_decode import ChoiceText, Piece, Top
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
TOOL_FIELDS = ("tools", "tool_choice", "functions", "function_call")


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
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False


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
    """One request made concrete: its prompts' tokens and the Whitney `sample` of each (a
    chat has one prompt), the choices' stops, and what the answer shows."""

    prompts: list[list[int]]
    payloads: list[dict[str, Any]]
    seeds: list[int]
    n: int
    stops: tuple[str, ...]
    stop_ids: frozenset[int]
    logprobs: bool
    top: int  # alternatives per token
    echoes: list[str] | None  # the prompts' texts, ahead of their choices' (completions' echo)
    exchanges: list[dict[str, Any] | None]  # what `serve --capture` keeps of each prompt


def plan_chat(request: ChatRequest, served: ServedModel, limits: Limits) -> Plan:
    for name in TOOL_FIELDS:
        if getattr(request, name) is not None:
            raise _fail(name, "tool and function calling are not served; send text messages")
    if request.top_logprobs and not request.logprobs:
        raise _fail("top_logprobs", "needs logprobs: true")
    messages = [_message_text(m, i) for i, m in enumerate(request.messages)]
    try:
        checked = check_messages(messages)
    except ValueError as exc:
        field = str(exc).split(" ", 1)[0]
        raise InvalidRequest(str(exc), details={"field": field}) from None
    prompt = served.renderer.build_generation_prompt(checked)
    max_tokens = request.max_completion_tokens or request.max_tokens
    field = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
    return _plan(
        request,
        served,
        limits,
        [prompt],
        tuple(served.renderer.stop_tokens),
        max_tokens,
        ("messages", field),
        logprobs=(request.logprobs, request.top_logprobs or 0),
        echoes=None,
        exchanges=[{"messages": checked}],
    )


def plan_completion(request: CompletionRequest, served: ServedModel, limits: Limits) -> Plan:
    if request.echo and request.logprobs is not None:
        raise _fail("echo", "not served with logprobs (the prompt's logprobs are not computed)")
    given: Any = request.prompt
    many = isinstance(given, list) and bool(given) and isinstance(given[0], (str, list))
    texts = given if many else [given]
    prompts = []
    for number, text in enumerate(texts):
        if isinstance(text, str):
            bos = served.tokenizer.bos_id
            prompts.append(([] if bos is None else [bos]) + served.tokenizer.encode(text))
        else:
            prompts.append(list(text))
        if not prompts[-1]:
            raise _fail(f"prompt[{number}]" if many else "prompt", "must not be empty")
    return _plan(
        request,
        served,
        limits,
        prompts,
        (served.tokenizer.eos_id,),
        request.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS,
        ("prompt", "max_tokens"),
        logprobs=(request.logprobs is not None, request.logprobs or 0),
        echoes=[t if isinstance(t, str) else served.tokenizer.decode(t) for t in texts]
        if request.echo
        else None,
        exchanges=[{"prompt": t} if isinstance(t, str) else None for t in texts],
    )


def _plan(
    request: SamplingRequest,
    served: ServedModel,
    limits: Limits,
    prompts: list[list[int]],
    stop_ids: tuple[int, ...],
    max_tokens: int | None,
    fields: tuple[str, str],
    *,
    logprobs: tuple[bool, int],
    echoes: list[str] | None,
    exchanges: list[dict[str, Any] | None],
) -> Plan:
    """The `sample` of each prompt; `fields` name the prompt and max_tokens in refusals."""
    prompt_field, max_field = fields
    longest = max(len(p) for p in prompts)
    if longest > limits.max_tokens_per_datum:
        raise exceeded(prompt_field, "max_tokens_per_datum", limits.max_tokens_per_datum, longest)
    room = served.max_positions - longest
    if room < 1:
        raise _fail(
            prompt_field,
            f"its {longest} tokens fill the model's {served.max_positions} positions",
        )
    if max_tokens is None:
        max_tokens = min(room, limits.max_tokens)
    if max_tokens > limits.max_tokens:
        raise exceeded(max_field, "max_tokens", limits.max_tokens, max_tokens)
    if max_tokens > room:
        raise _fail(
            max_field,
            f"{max_tokens} + the prompt's {longest} tokens exceed the model's "
            f"{served.max_positions} positions",
        )
    if request.n > limits.max_num_samples:
        raise exceeded("n", "max_num_samples", limits.max_num_samples, request.n)
    total = sum(request.n * (len(p) + max_tokens) for p in prompts)
    if total > limits.max_tokens_per_request:
        field = "n" if len(prompts) == 1 else prompt_field
        raise exceeded(field, "max_tokens_per_request", limits.max_tokens_per_request, total)
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
    payloads = [
        {"prompt": {"token_ids": p}, "num_samples": request.n, "sampling_params": params}
        for p in prompts
    ]
    return Plan(
        prompts=prompts,
        payloads=payloads,
        seeds=[secrets.randbits(63) for _ in prompts],
        n=request.n,
        stops=stops,
        stop_ids=frozenset(stop_ids) | frozenset(served.eos_token_ids),
        logprobs=logprobs[0],
        top=logprobs[1],
        echoes=echoes,
        exchanges=exchanges,
    )


@dataclass(frozen=True)
class Answer:
    """The choices of a plan (choice `p * n + r` is sample r of prompt p) and how many tokens
    were sampled."""

    choices: list[ChoiceText]
    sampled: int

    def texts(self, prompt: int, n: int) -> list[str]:
        return [c.text for c in self.choices[prompt * n : (prompt + 1) * n]]


def generate(
    served: ServedModel,
    plan: Plan,
    cancel: threading.Event,
    sink: Callable[[list[Piece]], None] | None = None,
) -> Answer:
    """The plan's choices, decoded as the engine samples them (one engine `sample` of every
    prompt); `sink` gets each step's pieces as they are made. A choice a stop string ends
    stops sampling there. `cancel` set stops the engine at its next token step."""
    choices = [
        ChoiceText(i, served.tokenizer, plan.stops, plan.stop_ids)
        for i in range(len(plan.prompts) * plan.n)
    ]

    def on_step(
        rows: list[int],
        tokens: list[int],
        logprobs: list[float],
        top: list[Top],
        ends: list[str | None],
    ) -> list[int]:
        pieces, ended = [], []
        for row, token, logprob, alternatives, end in zip(
            rows, tokens, logprobs, top, ends, strict=True
        ):
            piece = choices[row].add(token, logprob, alternatives, end)
            if piece is not None:
                pieces.append(piece)
            if end is None and choices[row].finish_reason is not None:
                ended.append(row)
        if sink is not None and pieces:
            sink(pieces)
        return ended

    try:
        outputs = served.sample(plan.payloads, plan.seeds, cancel, on_step, plan.top)
    except WhitneyError as exc:
        raise _openai_fields(exc) from None
    sampled = sum(int(output.usage.get("sampled_tokens", 0)) for output in outputs)
    return Answer(choices, sampled)


def _openai_fields(exc: WhitneyError) -> WhitneyError:
    """An engine refusal naming the request's field as OpenAI spells it."""
    field = exc.details.get("field")
    if isinstance(field, str):
        name = ENGINE_FIELDS.get(field, field.removeprefix("sampling_params."))
        exc.details["field"] = name
    return exc


def _usage(plan: Plan, sampled: int) -> dict[str, int]:
    prompt = sum(len(p) for p in plan.prompts)
    return {"prompt_tokens": prompt, "completion_tokens": sampled, "total_tokens": prompt + sampled}


def _token(served: ServedModel, token: int, logprob: float) -> dict[str, Any]:
    text = served.tokenizer.decode([token])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def _chat_logprobs(served: ServedModel, piece: Piece | ChoiceText) -> dict[str, Any]:
    return {
        "content": [
            _token(served, t, lp)
            | {"top_logprobs": [_token(served, alt, alt_lp) for alt, alt_lp in top]}
            for t, lp, top in zip(piece.tokens, piece.logprobs, piece.top, strict=True)
        ]
    }


def _completion_logprobs(
    served: ServedModel, piece: Piece | ChoiceText, start: int, top: int
) -> dict[str, Any]:
    texts = [served.tokenizer.decode([t]) for t in piece.tokens]
    offsets, at = [], start
    for text in texts:
        offsets.append(at)
        at += len(text)
    alternatives = (
        [{served.tokenizer.decode([t]): lp for t, lp in position} for position in piece.top]
        if top
        else None
    )
    return {
        "tokens": texts,
        "token_logprobs": piece.logprobs,
        "top_logprobs": alternatives,
        "text_offset": offsets,
    }


def _echo(plan: Plan, index: int) -> str:
    return plan.echoes[index // plan.n] if plan.echoes is not None else ""


def _answer(
    prefix: str, kind: str, model: str, plan: Plan, answer: Answer, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    """A whole (not streamed) answer: a new id, its object type, the time, model and usage."""
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(plan, answer.sampled),
    }


def chat_answer(model: str, plan: Plan, served: ServedModel, answer: Answer) -> dict[str, Any]:
    choices = [
        {
            "index": c.index,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": _chat_logprobs(served, c) if plan.logprobs else None,
            "finish_reason": c.finish_reason,
        }
        for c in answer.choices
    ]
    return _answer("chatcmpl", "chat.completion", model, plan, answer, choices)


def completion_answer(
    model: str, plan: Plan, served: ServedModel, answer: Answer
) -> dict[str, Any]:
    choices = [
        {
            "index": c.index,
            "text": _echo(plan, c.index) + c.text,
            "logprobs": _completion_logprobs(served, c, 0, plan.top) if plan.logprobs else None,
            "finish_reason": c.finish_reason,
        }
        for c in answer.choices
    ]
    return _answer("cmpl", "text_completion", model, plan, answer, choices)


class ChatStream:
    """The chunks of a streamed chat answer: the choices' roles, then each piece as it comes,
    then (if asked) the usage."""

    object = "chat.completion.chunk"

    def __init__(self, model: str, plan: Plan, served: ServedModel) -> None:
        self.model, self.plan, self.served = model, plan, served
        self.ident, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.ident,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def opening(self) -> list[dict[str, Any]]:
        delta = {"role": "assistant", "content": ""}
        count = len(self.plan.prompts) * self.plan.n
        return [
            self._chunk([{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
            for i in range(count)
        ]

    def pieces(self, pieces: list[Piece]) -> list[dict[str, Any]]:
        out = []
        for piece in pieces:
            if piece.text or piece.tokens:
                lp = _chat_logprobs(self.served, piece) if self.plan.logprobs else None
                choice = {"index": piece.index, "delta": {"content": piece.text}, "logprobs": lp}
                out.append(self._chunk([choice | {"finish_reason": None}]))
            if piece.finish_reason is not None:
                choice = {"index": piece.index, "delta": {}, "logprobs": None}
                out.append(self._chunk([choice | {"finish_reason": piece.finish_reason}]))
        return out

    def closing(self, answer: Answer, usage: bool) -> list[dict[str, Any]]:
        return [self._chunk([], usage=_usage(self.plan, answer.sampled))] if usage else []


class CompletionStream(ChatStream):
    """The chunks of a streamed completion: each piece as it comes (after the prompt, with
    `echo`), then (if asked) the usage."""

    object = "text_completion"

    def __init__(self, model: str, plan: Plan, served: ServedModel) -> None:
        super().__init__(model, plan, served)
        self.ident = f"cmpl-{uuid.uuid4().hex}"
        self.offsets: dict[int, int] = {}

    def opening(self) -> list[dict[str, Any]]:
        if self.plan.echoes is None:
            return []
        count = len(self.plan.prompts) * self.plan.n
        return [self._text(i, _echo(self.plan, i), None, None) for i in range(count)]

    def _text(self, index: int, text: str, logprobs: Any, finish: str | None) -> dict[str, Any]:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return self._chunk([choice])

    def pieces(self, pieces: list[Piece]) -> list[dict[str, Any]]:
        out = []
        for piece in pieces:
            if piece.text or piece.tokens:
                offset = self.offsets.get(piece.index, 0)
                lp = (
                    _completion_logprobs(self.served, piece, offset, self.plan.top)
                    if self.plan.logprobs
                    else None
                )
                out.append(self._text(piece.index, piece.text, lp, None))
                self.offsets[piece.index] = offset + len(piece.text)
            if piece.finish_reason is not None:
                out.append(self._text(piece.index, "", None, piece.finish_reason))
        return out
