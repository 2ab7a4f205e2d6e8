"""What the restart and soak tests share: `whitney-flows run rl` as a process against a served
Whitney (tests/local/served.py) that they SIGKILL and start again, and the journal and the
process table read after it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from flowtest_cli import CONSOLE_SCRIPT
from prefect.settings import PREFECT_API_URL

from tests.local.served import ServedWhitney
from tests.processes import process_states

FLOW_TIMEOUT_S = 600.0


@dataclass
class FlowProcess:
    """One `whitney-flows run rl --api-url ...` process and the files it writes."""

    name: str
    process: subprocess.Popen[str]
    metrics: Path
    adapters: Path
    log: Path

    def cycles_done(self) -> int:
        """Cycles whose metrics line is written."""
        return len(self.metrics.read_text().splitlines()) if self.metrics.exists() else 0

    def wait(self, timeout: float = FLOW_TIMEOUT_S) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"flow {self.name} did not end: {self.tail()}") from None

    def adapter_sha256(self) -> str:
        """The sha256 of the downloaded adapter (beside it: its manifest)."""
        (adapter,) = (p for p in self.adapters.iterdir() if not p.name.endswith("-manifest.json"))
        return hashlib.sha256(adapter.read_bytes()).hexdigest()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text().splitlines()[-lines:])

    def descendants(self) -> set[int]:
        """The PIDs of the processes it started, and theirs (Linux /proc)."""
        found: set[int] = set()
        parents = {self.process.pid}
        while parents:
            children = {pid for pid, parent in process_parents().items() if parent in parents}
            parents = children - found
            found |= children
        return found


def start_flow(
    server: ServedWhitney,
    workdir: Path,
    name: str,
    *arguments: str,
    own_prefect_server: bool = False,
) -> FlowProcess:
    """`whitney-flows run rl --api-url SERVER ARGUMENTS` in the background, recorded on this
    session's Prefect server (or, `own_prefect_server`, on an ephemeral one it starts)."""
    directory = workdir / name
    directory.mkdir(parents=True)
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("WHITNEY_API_", "PREFECT_API_"))
    }
    environment |= {"WHITNEY_API_KEY": server.keys[0], "XDG_DATA_HOME": str(directory)}
    if own_prefect_server:
        environment["PREFECT_HOME"] = str(directory / "prefect-home")
    else:
        environment["PREFECT_API_URL"] = PREFECT_API_URL.value()
    metrics, adapters, log = directory / "metrics.jsonl", directory / "adapters", directory / "log"
    argv = [str(CONSOLE_SCRIPT), "run", "rl", "--api-url", server.url, *arguments]
    argv += ["--metrics-out", str(metrics), "--adapter-dir", str(adapters)]
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, cwd=directory, env=environment, stdout=out, stderr=subprocess.STDOUT, text=True
        )
    return FlowProcess(name, process, metrics, adapters, log)


def wait_for_cycles(flow: FlowProcess, cycles: int, timeout: float = FLOW_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while flow.cycles_done() < cycles:
        assert flow.process.poll() is None, f"flow {flow.name} ended early: {flow.tail()}"
        assert time.monotonic() < deadline, f"flow {flow.name} is stuck: {flow.tail()}"
        time.sleep(0.05)


def wait_for_an_operation_in_flight(
    server: ServedWhitney, flow: FlowProcess, timeout: float = FLOW_TIMEOUT_S
) -> None:
    """Until the journal holds an operation of a ready run submitted and not yet finished: a
    kill then leaves that run active for the next start to rebuild."""
    deadline = time.monotonic() + timeout
    while not in_flight(server):
        assert flow.process.poll() is None, f"flow {flow.name} ended early: {flow.tail()}"
        assert time.monotonic() < deadline, f"flow {flow.name} is stuck: {flow.tail()}"
        time.sleep(0.01)


def in_flight(server: ServedWhitney) -> bool:
    return bool(
        journal_rows(
            server,
            "SELECT 1 FROM operations o JOIN runs r ON r.run_id = o.run_id"
            " WHERE r.status = 'ready' AND o.status IN ('pending', 'running') LIMIT 1",
        )
    )


def kill_and_restart(server: ServedWhitney) -> float:
    """SIGKILL the server and start it again on its port and data directory; the seconds
    it was away."""
    started = time.monotonic()
    server.kill()
    server.restart()
    return time.monotonic() - started


def data_dir(server: ServedWhitney) -> Path:
    return Path(server.argv[server.argv.index("--data-dir") + 1])


def executions(server: ServedWhitney) -> dict[tuple[str, int], tuple[int, str]]:
    """(run_id, seq_id) -> (executions, status) of every journaled operation."""
    rows = journal_rows(server, "SELECT run_id, seq_id, executions, status FROM operations")
    return {(run, seq): (count, status) for run, seq, count, status in rows}


def journal_rows(server: ServedWhitney, query: str) -> list[tuple]:
    """The rows of `query` on the server's journal, opened read-only."""
    conn = sqlite3.connect(f"file:{data_dir(server) / 'journal.sqlite3'}?mode=ro", uri=True)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def assert_no_seq_id_ran_twice(server: ServedWhitney) -> None:
    """Every journaled operation committed at most once, and a succeeded one exactly once."""
    twice = {key: value for key, value in executions(server).items() if value[0] > 1}
    assert not twice, twice
    unexecuted = [
        key
        for key, (count, status) in executions(server).items()
        if status == "succeeded" and count != 1
    ]
    assert not unexecuted, unexecuted


def process_parents() -> dict[int, int]:
    """PID -> parent PID of every live process that is not a zombie (Linux /proc)."""
    return {pid: ppid for pid, (state, ppid) in process_states().items() if state != "Z"}


def sigkill(flow: FlowProcess) -> None:
    flow.process.send_signal(signal.SIGKILL)
    flow.process.wait()


def summary_json(flow: FlowProcess) -> list[dict[str, object]]:
    return [json.loads(line) for line in flow.metrics.read_text().splitlines()]
