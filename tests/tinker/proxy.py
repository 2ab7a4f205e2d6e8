"""A loopback HTTP proxy that loses answers: the request reaches the server, which acts on it,
and the connection closes before the client reads a byte of the answer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class DroppingProxy(ThreadingHTTPServer):
    """Forwards to `upstream`; the first answer to each path in `drop` is lost."""

    daemon_threads = True

    def __init__(self, upstream: str, drop: set[str]) -> None:
        self.upstream = httpx.Client(base_url=upstream, timeout=120)
        self.to_drop = set(drop)
        self.dropped: list[str] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

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
        if self.server.should_drop(self.path.split("?")[0]):
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
def dropping_proxy(upstream: str, drop: set[str]) -> Iterator[DroppingProxy]:
    proxy = DroppingProxy(upstream, drop)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
        proxy.upstream.close()
