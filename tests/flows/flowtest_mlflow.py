"""A real `mlflow server` for the tracking tests: started on a loopback port with a SQLite
store in a directory of the test's, ready once /health answers, stopped by its PID (its
process group)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

SERVER_START_S = 120.0


def free_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


@dataclass
class MlflowServer:
    """An `mlflow server` process (its own process group) and its URL."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def ready(self) -> str:
        """The URL, once /health answers (polled; fails if the server exits or is late)."""
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self.url
            except httpx.TransportError:
                pass
            assert self.process.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "mlflow server did not answer /health"
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=0.25)  # returns at once if it dies

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL if it has not exited 30 s later."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def start_mlflow_server(directory: Path, port: int) -> MlflowServer:
    """`mlflow server` on 127.0.0.1:`port`, its store and artifacts in `directory` (a server
    started again on the same directory and port has the same runs); not waited for."""
    command = [
        *(sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)),
        *("--backend-store-uri", f"sqlite:///{directory / 'mlflow.db'}"),
        *("--artifacts-destination", str(directory / "artifacts"), "--workers", "1"),
    ]
    environment = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    environment.pop("WHITNEY_API_KEY", None)
    log = directory / "server.log"
    with log.open("ab") as output:
        process = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )
    return MlflowServer(process, f"http://127.0.0.1:{port}", log)
