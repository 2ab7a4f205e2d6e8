"""A Tinker request body: measured as sent and, zstd-compressed, again as it inflates.

The wire bytes are capped by `read_body` (413 past `max_body_bytes`) on the event loop; a
`Content-Encoding: zstd` body is then decompressed, in the worker thread that parses it and
runs the call, as a stream that stops at `max_body_bytes` + 1 bytes, so a small body that
would inflate past the limit is refused without inflating it whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import zstandard
from fastapi import Request

from whitney.errors import InvalidRequest, PayloadTooLarge
from whitney.local.request_body import invalid, parse_json, read_body
from whitney.local.tinker.proto import ForwardBackwardIn, ProtoError, decode_forward_backward

_READ_SIZE = 1 << 16


@dataclass(frozen=True)
class Sent:
    """A body as it came off the wire, its encoding checked, not yet inflated or parsed."""

    raw: bytes
    zstd: bool
    max_bytes: int

    def content(self) -> bytes:
        """The body after any zstd, at most `max_bytes` of it."""
        return inflate(self.raw, self.max_bytes) if self.zstd else self.raw


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


async def read_sent(request: Request, max_bytes: int) -> Sent:
    """The body's wire bytes (capped) and whether they are zstd (no other encoding served)."""
    raw = await read_body(request, max_bytes)
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity", "zstd"):
        raise invalid("Content-Encoding", f"{encoding[:32]!r} is not served (zstd or none)")
    return Sent(raw, encoding == "zstd", max_bytes)


def json_body(sent: Sent) -> dict[str, Any]:
    """The body as a JSON object (`{}` when empty); called in a worker thread."""
    content = sent.content()
    if not content.strip():
        return {}
    value = parse_json(content)
    if not isinstance(value, dict):
        raise invalid("body", "expected a JSON object")
    return value


def forward_backward_body(sent: Sent) -> ForwardBackwardIn:
    """The body as a protobuf `ForwardBackwardRequest`; called in a worker thread."""
    try:
        return decode_forward_backward(sent.content())
    except ProtoError as exc:
        raise InvalidRequest(
            f"body (protobuf ForwardBackwardRequest): {exc}", details={"field": exc.field}
        ) from None
