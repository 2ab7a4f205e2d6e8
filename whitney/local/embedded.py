"""`EmbeddedWhitney`: the server on a free loopback port in a background thread.

    with EmbeddedWhitney() as server:
        client = WhitneyClient(server.url, api_key=server.api_key)
        ...

The data directory is a fresh temporary one (removed on exit) unless one is given; a given
one a live server owns is refused (`whitney.local.ownership.DataDirOwned`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from whitney.local.config import (
    DEFAULT_GAP_TIMEOUT_S,
    DEFAULT_POST_WAIT_S,
    DEFAULT_SESSION_TTL_S,
    ServerConfig,
    generate_api_key,
)
from whitney.local.limits import Limits

STARTUP_TIMEOUT_S = 20.0


class ServerStartError(RuntimeError):
    """The server could not start; the message is one line meant for a human."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); ServerStartError with a clear line if not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(
        family, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )  # asyncio sets TCP_NODELAY only then
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServerStartError(
                f"cannot listen on {host}:{port}: address already in use"
            ) from None
        raise ServerStartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def check_data_dir(path: Path) -> Path:
    """Create the data directory and prove it writable; ServerStartError if it is not."""
    path = Path(path).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}-{threading.get_ident()}"  # one per start
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ServerStartError(f"data directory {str(path)!r} is not writable: {reason}") from None
    return path.resolve()


def check_dependencies() -> None:
    """The server's packages are importable (the `local` extra); ServerStartError if not."""
    import importlib.util

    missing = [
        name
        for name in ("torch", "safetensors", "fastapi", "uvicorn")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise ServerStartError(
            f"missing {', '.join(missing)}: the embedded server needs the 'local' extra "
            "(pip install 'whitney-flows[local]')"
        )


def make_uvicorn(app: Any, host: str, port: int, *, log_level: str = "warning") -> Any:
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="asyncio",
        http="auto",  # httptools when installed (faster), else h11
        ws="none",
        lifespan="on",
        log_config=None,
        log_level=log_level,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=30,
    )
    return uvicorn.Server(config)


class EmbeddedWhitney:
    """A Whitney server on 127.0.0.1:<free port>, run in a background thread."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        api_keys: list[str] | None = None,
        latency_ms: float = 0,
        fail_before_rate: float = 0.0,
        drop_after_commit_rate: float = 0.0,
        fault_seed: int = 0,
        gap_timeout_s: float = DEFAULT_GAP_TIMEOUT_S,
        post_wait_s: float = DEFAULT_POST_WAIT_S,
        limits: Limits | None = None,
        hf_dirs: tuple[Path, ...] = (),
        hf_cache: str | Path | None = None,
        session_ttl_s: float = DEFAULT_SESSION_TTL_S,
        capture: str | Path | None = None,
        tinker_url: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self._given_data_dir = Path(data_dir) if data_dir is not None else None
        self.api_keys: list[str] = list(api_keys) if api_keys else [generate_api_key()]
        self.api_key: str = self.api_keys[0]
        self.host = host
        self._settings = {
            "latency_ms": latency_ms,
            "fail_before_rate": fail_before_rate,
            "drop_after_commit_rate": drop_after_commit_rate,
            "fault_seed": fault_seed,
            "gap_timeout_s": gap_timeout_s,
            "post_wait_s": post_wait_s,
            "limits": limits or Limits(),
            "hf_dirs": tuple(Path(d).resolve() for d in hf_dirs),
            "session_ttl_s": session_ttl_s,
            "capture": None if capture is None else Path(capture),
            "tinker_url": tinker_url,
        }
        if hf_cache is not None:  # else the environment's, when the server starts
            self._settings["hf_cache"] = Path(hf_cache)
        self.data_dir: Path | None = None
        self.port: int | None = None
        self.service: Any = None
        self._temp_dir: Path | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> EmbeddedWhitney:
        with self._lock:
            if self._thread is not None:
                return self
            check_dependencies()
            from whitney.local.app import create_app
            from whitney.local.service import WhitneyService

            if self._given_data_dir is None:
                self._temp_dir = Path(tempfile.mkdtemp(prefix="whitney-local-"))
                self.data_dir = self._temp_dir
            else:
                self.data_dir = check_data_dir(self._given_data_dir)
            sock = None
            try:
                config = ServerConfig(
                    data_dir=self.data_dir, api_keys=self.api_keys, **self._settings
                )
                self.service = WhitneyService(config)
                self.service.preload_engine()
                sock = bind_socket(self.host, 0)
                self.port = sock.getsockname()[1]
                self._server = make_uvicorn(create_app(self.service), self.host, self.port)
                self._thread = threading.Thread(
                    target=self._server.run,
                    kwargs={"sockets": [sock]},
                    name=f"whitney-embedded-{self.port}",
                    daemon=True,
                )
                self._thread.start()
                deadline = time.monotonic() + STARTUP_TIMEOUT_S
                while not self._server.started:
                    if not self._thread.is_alive() or time.monotonic() > deadline:
                        raise ServerStartError("the embedded Whitney server did not start")
                    time.sleep(0.005)
            except BaseException:
                if sock is not None and self._thread is None:
                    sock.close()  # once the thread runs, uvicorn owns (and closes) it
                self._teardown()
                raise
            return self

    def stop(self) -> None:
        with self._lock:
            self._teardown()

    def _teardown(self) -> None:
        if self.service is not None:
            self.service.wake_waiters()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self._thread = None
        self._server = None
        if self.service is not None:
            with contextlib.suppress(Exception):
                self.service.shutdown()
            self.service = None
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def __enter__(self) -> EmbeddedWhitney:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.url if self.port is not None else "not started"
        return f"EmbeddedWhitney({where}, data_dir={str(self.data_dir)!r})"
