"""A Tinker request body: measured as sent and, zstd-compressed, again as it inflates.

The wire bytes are capped by `read_body` (413 past `max_body_bytes`); a `Content-Encoding:
zstd` body is then decompressed as a stream that stops at `max_body_bytes` + 1 bytes, so a
small body that would inflate past the limit is refused without inflating it whole.
"""

from __future__ import annotations

from typing import Any

import zstandard
from fastapi import Request
from starlette.concurrency import run_in_threadpool

from whitney.errors import PayloadTooLarge
from whitney.local.request_body import invalid, parse_json, read_body

_READ_SIZE = 1 << 16


def inflate(raw: bytes, max_bytes: int) -> bytes:
    """`raw` zstd-decompressed, at most `max_bytes` of it (413 past that, 400 if corrupt)."""
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    out = bytearray()
    try:
        while chunk := reader.read(_READ_SIZE):
            out += chunk
            if len(out) > max_bytes:
                raise PayloadTooLarge(
                    f"body: inflates past the server's max_body_bytes of {max_bytes} "
                    f"(from {len(raw)} zstd bytes)",
                    details={"field": "body", "limit": "max_body_bytes", "max": max_bytes},
                )
    except zstandard.ZstdError as exc:
        raise invalid("body", f"not a zstd stream ({exc})") from None
    return bytes(out)


async def read_raw(request: Request, max_bytes: int) -> bytes:
    """The body's bytes after any `Content-Encoding: zstd`, both sizes capped."""
    raw = await read_body(request, max_bytes)
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding != "zstd":
        raise invalid("Content-Encoding", f"{encoding[:32]!r} is not served (zstd or none)")
    return await run_in_threadpool(inflate, raw, max_bytes)


async def read_json_body(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object (`{}` when empty)."""
    raw = await read_raw(request, max_bytes)
    if not raw.strip():
        return {}
    value = await run_in_threadpool(parse_json, raw)
    if not isinstance(value, dict):
        raise invalid("body", "expected a JSON object")
    return value
