"""The end-to-end harness: real processes (Prefect server, worker, Whitney server, Chromium),
each in its own process group, each stopped by PID; a thin Prefect REST client; waits that
always end.

Nothing here imports flows or tasks: the e2e tests drive the product the way a user does,
through its command lines and the Prefect API.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.processes import process_states

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts"
BIN_DIR = Path(sys.executable).parent

T = TypeVar("T")


class HarnessError(AssertionError):
    """A process or a wait of the harness went wrong; the message carries the evidence."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def executable(name: str) -> str:
    """A console script of this virtualenv (the one running the tests)."""
    path = BIN_DIR / name
    if not path.exists():
        raise HarnessError(f"{name} is not installed in {BIN_DIR}")
    return str(path)


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float,
    interval: float = 0.25,
    evidence: Callable[[], str] | None = None,
) -> T:
    """Call `probe` until it returns something other than None/False; HarnessError after
    `timeout` seconds, with `evidence()` (log tails, states) in the message."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = probe()
        except (httpx.HTTPError, OSError) as error:
            value, last_error = None, error
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            detail = f"\nlast error: {last_error!r}" if last_error else ""
            extra = f"\n{evidence()}" if evidence else ""
            raise HarnessError(f"timed out after {timeout:g}s waiting for {what}{detail}{extra}")
        time.sleep(interval)


def children_of(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc), deepest last."""
    parents: dict[int, list[int]] = {}
    for child, (_, ppid) in process_states().items():
        parents.setdefault(ppid, []).append(child)
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        for child in parents.get(current, []):
            found.append(child)
            frontier.append(child)
    return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class ManagedProcess:
    """A child process in its own session (process group), its output in a log file.

    `stop()` signals the group (SIGINT first by default: the Prefect worker ignores SIGTERM),
    escalates to SIGTERM then SIGKILL, and finally kills by PID any descendant that left the
    group. Idempotent; safe to call on a process that never started properly.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str],
        log_dir: Path,
        cwd: Path = REPO_ROOT,
        stop_signals: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = dict(env)
        self.cwd = cwd
        self.log_path = log_dir / f"{name}.log"
        self.stop_signals = tuple(stop_signals)
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"$ {' '.join(argv)}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.process.pid
        self.descendants: set[int] = set()

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid})"

    def running(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        text = self.log_text().splitlines()[-lines:]
        return f"--- {self.name} (pid {self.pid}) log tail ---\n" + "\n".join(text)

    def check_running(self) -> None:
        if not self.running():
            raise HarnessError(
                f"{self.name} exited with code {self.process.returncode}\n{self.tail()}"
            )

    def check_stopped(self) -> None:
        if self.running():
            raise HarnessError(f"{self.name} (pid {self.pid}) is still running")

    def remember_descendants(self) -> None:
        if self.running():
            self.descendants.update(children_of(self.pid))

    def again(self) -> ManagedProcess:
        """The same command started again (same environment, directory and log file)."""
        return ManagedProcess(
            self.name, self.argv, self.env, self.log_path.parent, self.cwd, self.stop_signals
        )

    def kill(self) -> set[int]:
        """SIGKILL the process group, as a crash or `kill -9` would: what left the group (a
        worker's flow runs, in their own sessions) survives. Returns the PIDs of those
        descendants, still alive, for the caller to account for."""
        self.remember_descendants()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=15)
        if not self._log.closed:
            self._log.close()
        return {pid for pid in self.descendants if pid_alive(pid)}

    def stop(self, timeout: float = 15.0) -> None:
        self.remember_descendants()
        for sig in self.stop_signals:
            if not self.running():
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        if self.running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        # the group is gone; anything that escaped it (a new session) goes by PID
        for pid in sorted(self.descendants):
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if not self._log.closed:
            self._log.close()


def run_command(
    argv: list[str],
    env: Mapping[str, str],
    timeout: float,
    log_dir: Path,
    name: str,
    cwd: Path = REPO_ROOT,
    input_text: str | None = None,
) -> str:
    """Run a command to its end (its own process group, killed on timeout); return its
    output; HarnessError with the output if it fails."""
    log_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(input=input_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        (log_dir / f"{name}.log").write_text(output or "")
        raise HarnessError(
            f"{name} timed out after {timeout:g}s: {' '.join(argv)}\n{output}"
        ) from None
    (log_dir / f"{name}.log").write_text(output)
    if process.returncode != 0:
        raise HarnessError(
            f"{name} exited {process.returncode}: {' '.join(argv)}\n{output[-4000:]}"
        )
    return output


class PrefectAPI:
    """The Prefect server's REST API, as the UI calls it."""

    def __init__(self, api_url: str) -> None:
        self.api_url = api_url.rstrip("/")
        self.http = httpx.Client(base_url=self.api_url, timeout=30.0)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        # SQLite-backed servers answer "database is locked" as 503 now and then
        for attempt in range(5):
            response = self.http.request(method, path, **kwargs)
            if response.status_code not in (502, 503) or attempt == 4:
                break
            time.sleep(1.0)
        if response.status_code >= 400:
            raise HarnessError(f"{method} {path} -> {response.status_code}: {response.text[:2000]}")
        return response.json() if response.content else None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self._call("GET", path, **kwargs)

    def post(self, path: str, json: Any = None, **kwargs: Any) -> Any:
        return self._call("POST", path, json=json, **kwargs)

    def healthy(self) -> bool:
        try:
            return self.http.get("/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    # -- objects ------------------------------------------------------------------------------

    def deployment(self, flow_name: str, deployment_name: str) -> dict[str, Any]:
        return self.get(f"/deployments/name/{flow_name}/{deployment_name}")

    def flow_run(self, flow_run_id: str) -> dict[str, Any]:
        return self.get(f"/flow_runs/{flow_run_id}")

    def create_flow_run_from_deployment(
        self, deployment_id: str, parameters: dict[str, Any], message: str
    ) -> dict[str, Any]:
        """What the UI's Run > Custom run form posts."""
        return self.post(
            f"/deployments/{deployment_id}/create_flow_run",
            json={
                "parameters": parameters,
                "state": {"type": "SCHEDULED", "message": message},
            },
        )

    def child_flow_runs(self, flow_run_id: str) -> list[dict[str, Any]]:
        return self.post(
            "/flow_runs/filter",
            json={
                "flow_runs": {"parent_flow_run_id": {"any_": [flow_run_id]}},
                "sort": "START_TIME_ASC",
                "limit": 200,
            },
        )

    def _every_page(self, path: str, query: dict[str, Any]) -> list[dict[str, Any]]:
        """Every record a `/.../filter` query answers, 200 at a time."""
        records: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = self.post(path, json={**query, "limit": 200, "offset": offset})
            records.extend(page)
            if len(page) < 200:
                return records
            offset += 200

    def task_runs(self, flow_run_ids: list[str]) -> list[dict[str, Any]]:
        return self._every_page(
            "/task_runs/filter",
            {
                "task_runs": {"flow_run_id": {"any_": flow_run_ids}},
                "sort": "EXPECTED_START_TIME_ASC",
            },
        )

    def artifacts(self, flow_run_ids: list[str]) -> list[dict[str, Any]]:
        return self.post(
            "/artifacts/filter",
            json={"artifacts": {"flow_run_id": {"any_": flow_run_ids}}, "limit": 200},
        )

    def logs(self, flow_run_ids: list[str]) -> list[dict[str, Any]]:
        return self._every_page(
            "/logs/filter",
            {"logs": {"flow_run_id": {"any_": flow_run_ids}}, "sort": "TIMESTAMP_ASC"},
        )

    def events(self, resource_ids: list[str], max_pages: int = 100) -> list[dict[str, Any]]:
        """The events about (or related to) these resources, e.g. `prefect.flow-run.<id>`, in
        the default window (the last day), every page."""
        page = self.post(
            "/events/filter",
            json={"filter": {"any_resource": {"id": resource_ids}}, "limit": 50},
        )
        events = list(page["events"])
        for _ in range(max_pages):
            if not page.get("next_page"):
                break
            response = self.http.get(page["next_page"])
            if response.status_code >= 400:
                raise HarnessError(f"GET {page['next_page']} -> {response.status_code}")
            page = response.json()
            events.extend(page["events"])
        return events

    def set_flow_run_state(
        self, flow_run_id: str, state: dict[str, Any], force: bool = False
    ) -> dict[str, Any]:
        return self.post(
            f"/flow_runs/{flow_run_id}/set_state", json={"state": state, "force": force}
        )

    def wait_flow_run(
        self,
        flow_run_id: str,
        states: Iterable[str],
        timeout: float,
        evidence: Callable[[], str] | None = None,
    ) -> dict[str, Any]:
        """Poll the flow run until its state type is one of `states`; a terminal state that
        is not wanted fails at once."""
        wanted = set(states)
        terminal = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}

        def probe() -> dict[str, Any] | None:
            run = self.flow_run(flow_run_id)
            state = run.get("state") or {}
            kind = state.get("type")
            if kind in wanted:
                return run
            if kind in terminal:
                extra = f"\n{evidence()}" if evidence else ""
                raise HarnessError(
                    f"flow run {run['name']} ended {kind} ({state.get('name')}): "
                    f"{state.get('message')}{extra}"
                )
            return None

        return wait_for(
            f"flow run {flow_run_id} to reach {sorted(wanted)}",
            probe,
            timeout,
            interval=0.5,
            evidence=evidence,
        )
