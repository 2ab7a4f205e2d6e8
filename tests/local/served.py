"""`whitney-flows serve` in its own process, for the tests that attack it: they read its
resident memory and see that it survives (the in-process `embedded_server` shares the test
process's memory)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

KEYS = ("served-key-tenant-a", "served-key-tenant-b")
READY = re.compile(r"ready at (http://\S+) ")
START_TIMEOUT_S = 120.0


@dataclass
class ServedWhitney:
    """A running `serve` process: its URL, PID and the two tenants' keys."""

    url: str
    process: subprocess.Popen[str]
    keys: tuple[str, ...] = KEYS
    argv: tuple[str, ...] = ()
    log: Path = Path()

    def client(self, tenant: int = 0, **kwargs: object) -> httpx.Client:
        """A raw HTTP client of tenant `tenant` (0: A, 1: B)."""
        headers = {"Authorization": f"Bearer {self.keys[tenant]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]

    def rss_mb(self) -> float:
        """The server's resident memory now, in MiB (Linux /proc)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)[1]) / 1024  # type: ignore[index]

    def alive(self) -> bool:
        """The process runs and answers tenant B's capabilities."""
        if self.process.poll() is not None:
            return False
        with self.client(1) as client:
            return client.get("/v1/training/capabilities").status_code == 200

    def kill(self) -> None:
        """SIGKILL the server: no handler, no flush, no goodbye."""
        self.process.kill()
        self.process.wait()

    def restart(self) -> None:
        """Start `serve` again with the same flags, data directory and port (after `kill`)."""
        assert self.process.poll() is not None, "kill() it first"
        port = self.url.rsplit(":", 1)[1]
        argv = [*self.argv]
        argv[argv.index("--port") + 1] = port
        seen = len(READY.findall(self.log.read_text()))
        self.process = _start(argv, self.keys, self.log)
        assert _wait_ready(self.process, self.log, seen) == self.url
        self._wait_alive()

    def _wait_alive(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.alive():
            assert time.monotonic() < deadline, "the served Whitney did not answer"
            time.sleep(0.1)


@contextmanager
def served(tmp_path: Path, *flags: str, keys: tuple[str, ...] = KEYS) -> Iterator[ServedWhitney]:
    """`python -m whitney.local serve --port 0 FLAGS` with a fresh data directory under
    `tmp_path` and the API keys `keys`, until the block ends (SIGTERM, then SIGKILL after
    30 s)."""
    argv = [sys.executable, "-m", "whitney.local", "serve", "--port", "0"]
    argv += ["--data-dir", str(tmp_path / "served-data"), *flags]
    log = tmp_path / "served.log"
    process = _start(argv, keys, log)
    server = ServedWhitney("", process, keys, tuple(argv), log)
    try:
        server.url = _wait_ready(process, log, 0)
        server._wait_alive()
        yield server
    finally:
        if server.process.poll() is None:
            server.process.send_signal(signal.SIGTERM)
            try:
                server.process.wait(30)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()


def _start(argv: list[str], keys: tuple[str, ...], log: Path) -> subprocess.Popen[str]:
    """`argv` with the keys in the environment, its output appended to `log`."""
    env = os.environ | {"WHITNEY_LOCAL_API_KEYS": ",".join(keys)}
    with log.open("a") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def _wait_ready(process: subprocess.Popen[str], log: Path, seen: int) -> str:
    """The URL of the ready line `serve` prints to `log` (its stdout and stderr) after the
    `seen` ones already there."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        matches = READY.findall(log.read_text())
        if len(matches) > seen:
            return matches[-1]
        if process.poll() is not None:
            raise AssertionError(f"serve exited {process.returncode}: {log.read_text()}")
        time.sleep(0.05)
    raise AssertionError(f"serve printed no ready line: {log.read_text()}")
