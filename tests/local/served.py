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


@contextmanager
def served(tmp_path: Path, *flags: str, keys: tuple[str, ...] = KEYS) -> Iterator[ServedWhitney]:
    """`python -m whitney.local serve --port 0 FLAGS` with a fresh data directory under
    `tmp_path` and the API keys `keys`, until the block ends (SIGTERM, then SIGKILL after
    30 s)."""
    env = os.environ | {"WHITNEY_LOCAL_API_KEYS": ",".join(keys)}
    argv = [sys.executable, "-m", "whitney.local", "serve", "--port", "0"]
    argv += ["--data-dir", str(tmp_path / "served-data"), *flags]
    log = tmp_path / "served.log"
    with log.open("w") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        url = _wait_ready(process, log)
        server = ServedWhitney(url, process, keys)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.alive():
            assert time.monotonic() < deadline, "the served Whitney did not answer"
            time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(process: subprocess.Popen[str], log: Path) -> str:
    """The URL of the ready line `serve` prints to `log` (its stdout and stderr)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        match = READY.search(log.read_text())
        if match:
            return match[1]
        if process.poll() is not None:
            raise AssertionError(f"serve exited {process.returncode}: {log.read_text()}")
        time.sleep(0.05)
    raise AssertionError(f"serve printed no ready line: {log.read_text()}")
