"""A request body as JSON, refused before any service sees it when it cannot be a request.

Over `max_body_bytes` is 413 `payload_too_large`, from Content-Length or by counting while
streaming (never more than the limit is buffered). Not UTF-8, not JSON, an integer literal of
more than `MAX_INT_DIGITS` digits, a lone surrogate in a string or key, and nesting deeper
than `MAX_DEPTH` are 400 `invalid_request` naming the body or the field. NaN, Infinity and a
float overflowing to infinity parse as floats so that the strict wire models refuse them
naming their field (422 `invalid_datum` inside a datum, as docs/api.md says), as they refuse
an integer out of a field's range.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from whitney.errors import InvalidRequest, PayloadTooLarge

MAX_DEPTH = 64
"""Arrays and objects nest at most this deep (a request needs under 10)."""
MAX_INT_DIGITS = 40
"""No field takes an integer this long (they fit a signed 64-bit integer: 19 digits)."""

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_AS_SQUARE = bytes.maketrans(b"{}", b"[]")


class _Refused(ValueError):
    """A literal the JSON scanner must not turn into a value; its message is the reason."""


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request's body parsed as JSON (`{}` when empty), or the 400/413 refusing it."""
    raw = await read_body(request, max_bytes)
    if not raw.strip():
        return {}
    return await run_in_threadpool(parse_json, raw)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body's bytes, refused 413 as soon as it is known to be over `max_bytes`."""
    declared = _content_length(request)
    if declared is not None and declared > max_bytes:
        raise too_large(max_bytes, declared)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise too_large(max_bytes, size)
            chunks.append(chunk)
    except ClientDisconnect:
        raise invalid("body", f"the client left after {size} bytes") from None
    return b"".join(chunks)


def too_large(max_bytes: int, size: int) -> PayloadTooLarge:
    """The refusal of a body of (at least) `size` bytes."""
    return PayloadTooLarge(
        f"body: {size} bytes is over the server's max_body_bytes of {max_bytes}",
        details={"field": "body", "limit": "max_body_bytes", "max": max_bytes, "value": size},
    )


def _content_length(request: Request) -> int | None:
    header = request.headers.get("content-length")
    if header is None:
        return None
    try:
        return int(header)
    except ValueError:
        raise invalid("body", f"Content-Length {header[:32]!r} is not a number") from None


def invalid(field: str, reason: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {reason}", details={"field": field})


def parse_json(raw: bytes) -> Any:
    """`raw` as JSON: UTF-8, integers of at most `MAX_INT_DIGITS` digits, no lone surrogate,
    nested at most `MAX_DEPTH` deep."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid("body", f"not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text, parse_int=_integer)
    except _Refused as exc:
        raise invalid("body", str(exc)) from None
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:
        raise invalid("body", f"invalid JSON ({exc})") from None
    if _depth_over(raw, MAX_DEPTH):
        raise _too_deep()
    if _SURROGATE_ESCAPE.search(raw) and not _encodable(value):
        _check_surrogates(value)
    return value


def _encodable(value: Any) -> bool:
    """Whether every string and key of `value` is Unicode (no lone surrogate), at C speed."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _integer(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"the integer {_shown(literal)} is longer than any field takes")
    return int(literal)


def _shown(literal: str) -> str:
    return literal if len(literal) <= 24 else f"{literal[:20]}... ({len(literal)} characters)"


def _too_deep() -> InvalidRequest:
    return invalid("body", f"arrays and objects nest deeper than {MAX_DEPTH}")


def _depth_over(raw: bytes, limit: int) -> bool:
    """Whether valid JSON `raw` nests deeper than `limit`: strings dropped, only brackets
    kept (all as `[]`), then innermost pairs removed `limit` times; anything left was deeper."""
    brackets = _STRING.sub(b"", raw).translate(_AS_SQUARE, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


def _check_surrogates(value: Any) -> None:
    """The 400 naming a string or key that holds a lone surrogate (JSON decodes a valid
    `\\ud83d\\ude00` pair to one code point, so a surrogate left over is lone)."""
    for field, text in _strings(value, ""):
        if _SURROGATE.search(text):
            raise invalid(field or "body", "holds a lone surrogate (\\ud800-\\udfff): not Unicode")


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every string of `value` with the field holding it; a key is reported at its object."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, str):
            yield where, node
        elif isinstance(node, dict):
            for key, item in node.items():
                yield where, key
                stack.append((item, f"{where}.{key}" if where else key))
        elif isinstance(node, list):
            stack.extend((item, f"{where}[{index}]") for index, item in enumerate(node))
