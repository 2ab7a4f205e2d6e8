"""A loopback HTTP proxy that loses answers: the request reaches the server, which acts on it,
and the connection closes before the client reads a byte of the answer. Chosen paths lose
their first answer (`drop`), or every answer is held from `hold()` until `lose_held()` (a
client killed while it waits on the server)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class DroppingProxy(ThreadingHTTPServer):
    """Forwards to `upstream`; the first answer to each path in `drop` is lost, and so is each
    answer the server gives between `hold()` and `lose_held()`."""

    daemon_threads = True

    def __init__(self, upstream: str, drop: set[str] | frozenset[str]) -> None:
        self.upstream = httpx.Client(base_url=upstream, timeout=120)
        self.to_drop = set(drop)
        self.dropped: list[str] = []
        self.lock = threading.Lock()
        self.holding = False
        self.released = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)

    def hold(self) -> None:
        """From now on, each answer waits here (its request reached the server) until
        `lose_held`, which loses it."""
        with self.lock:
            self.holding = True
            self.released.clear()

    def lose_held(self) -> None:
        """The held answers are lost (their connections closed unanswered); later answers
        pass."""
        with self.lock:
            self.holding = False
            self.released.set()

    def should_hold(self, path: str) -> bool:
        """Whether to lose this answer, once held until `lose_held` (False at once when not
        holding)."""
        with self.lock:
            if not self.holding:
                return False
            released = self.released
        released.wait()
        with self.lock:
            self.dropped.append(path)
        return True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def should_drop(self, path: str) -> bool:
        with self.lock:
            if path in self.to_drop:
                self.to_drop.discard(path)
                self.dropped.append(path)
                return True
            return False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: DroppingProxy

    def log_message(self, *args: object) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
        answer = self.server.upstream.request(
            self.command, self.path, content=body, headers=headers
        )
        path = self.path.split("?")[0]
        if self.server.should_drop(path) or self.server.should_hold(path):
            self.close_connection = True
            return
        self.send_response(answer.status_code)
        for key, value in answer.headers.items():
            if key.lower() not in HOP_HEADERS | {"content-encoding"}:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = _forward


@contextmanager
def dropping_proxy(
    upstream: str, drop: set[str] | frozenset[str] = frozenset()
) -> Iterator[DroppingProxy]:
    proxy = DroppingProxy(upstream, drop)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.lose_held()
        proxy.shutdown()
        proxy.server_close()
        proxy.upstream.close()
