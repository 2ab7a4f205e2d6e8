"""A Tinker endpoint that answers 429 (with Retry-After), 503 or resets the connection, on
chosen requests: a small asyncio proxy (httpx to the upstream) in front of the embedded Tinker
front. The broker's SDK retries with backoff under the same Tinker seq_id (honouring
Retry-After on training requests); the run ends bit for bit where the CPU engine's ends, each
front operation executed once."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.local.served import ServedWhitney, served
from tests.tinker.steps import KEYS, adapter_sha256, assert_same, sdk_key, through_whitney
from tests.tinker.test_tinker_provider import front_operations, front_runs, tinker_key

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass
class Fault:
    """What the proxy does to the `nth` (1-based) request to `path`: `status` (429, 503) answered
    without forwarding, or `reset`: forwarded, then the connection reset before the answer."""

    path: str
    nth: int
    status: int | None = None
    retry_after_s: float | None = None
    reset: bool = False


@dataclass
class FaultProxy:
    upstream: str
    faults: list[Fault]
    seen: list[tuple[str, float]] = field(default_factory=list)  # (path, monotonic time)
    injected: list[Fault] = field(default_factory=list)
    url: str = ""

    def count(self, path: str) -> int:
        return sum(1 for seen, _ in self.seen if seen == path)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with httpx.AsyncClient(base_url=self.upstream, timeout=120) as upstream:
            try:
                while await self._one(reader, writer, upstream):
                    pass
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

    async def _one(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: httpx.AsyncClient,
    ) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        length = int({k.lower(): v for k, v in headers.items()}.get("content-length", 0))
        body = await reader.readexactly(length) if length else b""
        path = target.split("?")[0]
        self.seen.append((path, time.monotonic()))
        fault = next((f for f in self.faults if f.path == path and f.nth == self.count(path)), None)
        if fault is not None:
            self.injected.append(fault)
        if fault is not None and fault.status is not None:
            extra = (
                {} if fault.retry_after_s is None else {"Retry-After": f"{fault.retry_after_s:g}"}
            )
            await self._answer(writer, fault.status, b'{"error": "injected"}', extra)
            return True
        sent = {k: v for k, v in headers.items() if k.lower() not in HOP}
        answer = await upstream.request(method, target, content=body, headers=sent)
        if fault is not None and fault.reset:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # RST: the answer is lost
            return False
        kept = {
            k: v for k, v in answer.headers.items() if k.lower() not in HOP | {"content-encoding"}
        }
        await self._answer(writer, answer.status_code, answer.content, kept)
        return True

    @staticmethod
    async def _answer(
        writer: asyncio.StreamWriter, status: int, body: bytes, headers: dict[str, str]
    ) -> None:
        lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()]
        lines += [f"Content-Length: {len(body)}", "Content-Type: application/json"]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()


@contextmanager
def fault_proxy(upstream: str, faults: list[Fault]) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream, faults)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, asyncio.AbstractServer] = {}

    async def start() -> None:
        holder["server"] = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        proxy.url = f"http://127.0.0.1:{holder['server'].sockets[0].getsockname()[1]}"
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop)
    started.wait(10)
    try:
        yield proxy
    finally:
        loop.call_soon_threadsafe(holder["server"].close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


FAULTS = [
    Fault("/api/v1/forward_backward", 1, status=429, retry_after_s=2),
    Fault("/api/v1/optim_step", 1, status=503),
    Fault("/api/v1/optim_step", 3, status=429, retry_after_s=2),
    Fault("/api/v1/forward_backward", 3, reset=True),  # executed by the front, answer lost
    Fault("/api/v1/retrieve_future", 4, status=503),
    Fault("/api/v1/save_weights_for_sampler", 1, reset=True),
    Fault("/api/v1/asample", 1, status=503),
]


def test_429_503_and_resets_are_retried_and_applied_once(
    server: ServedWhitney, tmp_path: Path
) -> None:
    emulated = through_whitney(server.url, KEYS[0])
    before = {run["run_id"] for run in front_runs(server)}
    with (
        fault_proxy(server.url, FAULTS) as proxy,
        tinker_key(sdk_key(0)),
        served(tmp_path, "--tinker-url", proxy.url, keys=KEYS) as broker,
    ):
        forwarded = through_whitney(broker.url, KEYS[0])
        forwarded_sha = adapter_sha256(broker.url, KEYS[0], forwarded.run_id)
        injected = list(proxy.injected)
        seen = list(proxy.seen)
    assert {(f.path, f.nth) for f in injected} == {(f.path, f.nth) for f in FAULTS}
    assert_same(forwarded, emulated)
    assert forwarded_sha == adapter_sha256(server.url, KEYS[0], emulated.run_id)
    # Retry-After honoured (2 s, where the SDK's own backoff starts at 0.5 s and 1 s)
    for fault in (f for f in FAULTS if f.retry_after_s is not None):
        times = [t for path, t in seen if path == fault.path]
        assert times[fault.nth] - times[fault.nth - 1] >= fault.retry_after_s
    model = next(r for r in front_runs(server) if r["run_id"] not in before)
    done = front_operations(server, model["run_id"])
    assert all(executions == 1 for _, executions in done)
    assert [kind for kind, _ in done].count("forward_backward") == 3
    assert [kind for kind, _ in done].count("optim_step") == 3
    # 3 forward_backward and a forward, sent 4 + 2 times (a 429; a reset after the front
    # acted, resent under the same seq_id)
    assert [path for path, _ in seen].count("/api/v1/forward_backward") == 6
