"""The end-to-end stack, once per session, as docs/prefect-server.md ("Run it on a Prefect
server") sets it up by hand:

- `prefect server start` on 127.0.0.1:<free port> (tests/prefect_server.py's command line), with
  a fresh temporary PREFECT_HOME and the project's server settings
  (`flows.core.orchestration.prefect_env.SERVER_SETTINGS`, as the guide exports them); its
  database SQLite in that home, or, with `WHITNEY_E2E_POSTGRES=1` and always in CI, a
  PostgreSQL cluster of its own (tests/e2e/postgres.py; "The stack on PostgreSQL" in the
  guide);
- the embedded Whitney server (`whitney-flows serve`) on 127.0.0.1:<free port>, with a known
  key (in WHITNEY_LOCAL_API_KEYS) and a temporary data directory;
- `prefect work-pool create whitney-process --type process`;
- `prefect block register -m blocks`, `python -m blocks save whitney --base-url ...` (the key
  from WHITNEY_API_KEY of that one command), `python -m blocks check whitney`;
- `prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml` from the
  repository root; the evaluate-checkpoint and resume-run triggers it creates are then
  disabled, so that the runs of the other tests start no evaluation and no resume
  (tests/e2e/test_checkpoints.py and test_resume.py enable them for their own), and the
  resume sweep's schedule paused (tests/flows/core/test_resume_sweep.py tests the sweep);
- `prefect worker start --pool whitney-process` with a 1 s query interval. Its environment
  holds no Whitney URL or key: the flow runs get them from the block.

Every process runs in its own process group and is stopped by PID when the session ends,
whatever happened. Their logs go to test-artifacts/e2e-logs/. All tests here carry the `e2e`
marker: `pytest -m e2e` selects them, `pytest -m "not e2e"` leaves them out.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from flows.core.orchestration.prefect_env import SERVER_SETTINGS
from tests.prefect_server import prefect_server_argv

from . import postgres, redis_broker
from .harness import (
    ARTIFACTS_DIR,
    REPO_ROOT,
    HarnessError,
    ManagedProcess,
    PrefectAPI,
    executable,
    free_port,
    pid_alive,
    run_command,
    wait_for,
)

E2E_DIR = Path(__file__).resolve().parent
WORK_POOL = "whitney-process"
BLOCK_NAME = "whitney"
FLOW_NAME = "rl"
RL_DEPLOYMENT = "rl-on-demand"
EVALUATE_TRIGGER = "evaluate-every-saved-checkpoint"
"""The automation `prefect deploy` makes of evaluate-checkpoint's trigger."""
RESUME_TRIGGER = "resume-crashed-training-runs"
"""The automation `prefect deploy` makes of resume-run's trigger (test_resume.py enables it)."""
RESUME_SWEEP = ("resume-sweep", "resume-sweep-every-5-minutes")
"""The resume trigger's scheduled backstop (flow, deployment): paused in the stack."""
LOG_DIR = ARTIFACTS_DIR / "e2e-logs"
PREFECT_SERVER, WHITNEY_SERVER, WORKER = "prefect-server", "whitney-serve", "prefect-worker"
"""The parts of the stack, by the names of their processes (and logs)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: end-to-end tests against a real Prefect server, worker and browser"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@dataclass
class Stack:
    """The running stack and what the tests need to reach it."""

    api: PrefectAPI
    ui_url: str
    whitney_url: str
    whitney_key: str
    whitney_data: Path
    fault_dir: Path
    env: dict[str, str]
    database: str = "sqlite"
    """The Prefect server's database: "sqlite" or "postgresql"."""
    processes: list[ManagedProcess] = field(default_factory=list)
    orphans: set[int] = field(default_factory=set)
    """Processes a killed worker left running (its flow runs), killed when the stack stops."""

    def evidence(self) -> str:
        """The tails of every process's log, for a failure message."""
        return "\n".join(process.tail() for process in self.processes)

    def deployment(self, name: str = RL_DEPLOYMENT) -> dict[str, Any]:
        return self.api.deployment(FLOW_NAME, name)

    def check_alive(self) -> None:
        for process in self.processes:
            process.check_running()

    def process(self, name: str) -> ManagedProcess:
        """The current process of a part of the stack (PREFECT_SERVER, WHITNEY_SERVER, WORKER,
        and WORKER-2, ... when there are more workers)."""
        (process,) = (each for each in self.processes if each.name == name)
        return process

    def kill(self, name: str) -> None:
        """SIGKILL a part of the stack (its process group: a worker's flow runs, in their own
        sessions, go on)."""
        self.orphans |= self.process(name).kill()

    def restart(self, name: str) -> float:
        """Start a killed part again with its own command line, environment and data; wait
        until it is up; how long that took (s)."""
        old = self.process(name)
        old.check_stopped()
        started = time.monotonic()
        self.processes[self.processes.index(old)] = old.again()
        self.wait_up(name, since=time.time())
        return time.monotonic() - started

    def up(self, name: str, since: float = 0.0) -> bool:
        """Whether the part answers: the Prefect API's health, Whitney's capabilities, the
        worker's heartbeat recorded after `since` (epoch seconds)."""
        self.process(name).check_running()
        if name == PREFECT_SERVER:
            return self.api.healthy()
        if name == WHITNEY_SERVER:
            from whitney.errors import TransportError

            with self.whitney_client() as client:
                try:
                    return bool(client.capabilities().providers)
                except TransportError:
                    return False  # not listening yet: a restarted server rebuilds its state first
        workers = self.api.post(f"/work_pools/{WORK_POOL}/workers/filter", json={})
        return any(
            worker["name"] == _worker(name)
            and worker.get("status") == "ONLINE"
            and datetime.fromisoformat(worker["last_heartbeat_time"]).timestamp() > since
            for worker in workers
        )

    def wait_up(self, name: str, since: float = 0.0) -> None:
        timeout = {PREFECT_SERVER: 180, WHITNEY_SERVER: 90}.get(name, 90)
        wait_for(f"{name} to be up", lambda: self.up(name, since), timeout, evidence=self.evidence)

    def pause_deployment(self, flow_name: str, name: str, paused: bool = True) -> None:
        """Pause the deployment's schedules (its scheduled runs are deleted), or resume them
        (the UI's toggle)."""
        deployment = self.api.deployment(flow_name, name)
        action = "pause_deployment" if paused else "resume_deployment"
        self.api.post(f"/deployments/{deployment['id']}/{action}")

    def enable_automation(self, name: str, enabled: bool) -> None:
        """Turn the automation named `name` on or off (the UI's toggle)."""
        (automation,) = self.api.post(
            "/automations/filter", json={"automations": {"name": {"any_": [name]}}}
        )
        self.api._call("PATCH", f"/automations/{automation['id']}", json={"enabled": enabled})

    def whitney_client(self) -> Any:
        from whitney.client import WhitneyClient

        return WhitneyClient(self.whitney_url, self.whitney_key, max_retry_seconds=10)


def _worker(name: str) -> str:
    """The Prefect worker name of the worker process `name` (WORKER, then WORKER-2, ...)."""
    return name.replace(WORKER, "e2e-worker", 1)


def _child_env(prefect_home: Path, api_url: str, fault_dir: Path) -> dict[str, str]:
    """The environment of every process the stack starts: this one's, without any Prefect or
    Whitney setting of the caller, plus the stack's own."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PREFECT_", "WHITNEY_"))
    }
    env.update(
        {
            "PREFECT_HOME": str(prefect_home),
            "PREFECT_API_URL": api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            **SERVER_SETTINGS,
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            # a run waiting for a deployment's concurrency slot (evaluate-checkpoint's) asks
            # again after 2 s, not 30
            "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "2",
            # a sweep's trial waiting for a slot of its global concurrency limit asks again
            # within about 2 s, not up to 30 s (+ jitter) after a trial's average occupancy
            "PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS": "2",
            "PREFECT_WORKER_PREFETCH_SECONDS": "5",
            "PREFECT_CLI_COLORS": "false",
            "PYTHONUNBUFFERED": "1",
            # the e2e fault environment (e2e_faults.py) is importable by the flow runs
            "PYTHONPATH": os.pathsep.join(
                part for part in (str(E2E_DIR), env.get("PYTHONPATH", "")) if part
            ),
            "E2E_FAULT_DIR": str(fault_dir),
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        }
    )
    return env


def _whitney_serve_argv(port: int, data_dir: Path) -> list[str]:
    """The embedded server's command line (its key comes from WHITNEY_LOCAL_API_KEYS, never
    from argv, where `ps` would show it)."""
    args = ["--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]
    if (REPO_ROOT / "flows" / "cli.py").exists():
        return [executable("whitney-flows"), "serve", *args]
    return [sys.executable, "-m", "whitney.local", "serve", *args]


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(f"e2e: signal {signum}: stopping the stack")


@contextmanager
def running_stack(
    root: Path,
    log_dir: Path = LOG_DIR,
    database: str = "sqlite",
    workers: int = 1,
    redis: bool = False,
    server_settings: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """The stack under `root` (its data) with its logs in `log_dir`, its Prefect server on
    `database` ("sqlite" or "postgresql"), its events through a Redis of its own if `redis`,
    with `server_settings` on top of the project's, and `workers` workers, stopped on exit."""
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as resources:
        server_env: dict[str, str] = dict(server_settings or {})
        if database == "postgresql":
            cluster = resources.enter_context(postgres.running_postgres(log_dir))
            server_env["PREFECT_API_DATABASE_CONNECTION_URL"] = cluster.url
        elif database != "sqlite":
            raise HarnessError(f"database: {database!r} is neither 'sqlite' nor 'postgresql'")
        if redis:
            server_env.update(
                resources.enter_context(redis_broker.running_redis(log_dir)).server_env
            )
        yield resources.enter_context(_running_stack(root, log_dir, database, server_env, workers))


@contextmanager
def _running_stack(
    root: Path, log_dir: Path, database: str, server_env: dict[str, str], workers: int
) -> Iterator[Stack]:
    prefect_port, whitney_port = free_port(), free_port()
    ui_url = f"http://127.0.0.1:{prefect_port}"
    api = PrefectAPI(f"{ui_url}/api")
    fault_dir = root / "faults"
    fault_dir.mkdir()
    env = _child_env(root / "prefect-home", api.api_url, fault_dir)
    whitney_key = f"e2e-key-{secrets.token_hex(12)}"
    prefect = executable("prefect")
    processes: list[ManagedProcess] = []
    stack = Stack(
        api=api,
        ui_url=ui_url,
        whitney_url=f"http://127.0.0.1:{whitney_port}",
        whitney_key=whitney_key,
        whitney_data=root / "whitney-data",
        fault_dir=fault_dir,
        env=env,
        database=database,
        processes=processes,
    )
    try:
        processes.append(
            ManagedProcess(
                PREFECT_SERVER,
                prefect_server_argv(prefect_port),
                {**env, **server_env},
                log_dir,
            )
        )
        processes.append(
            ManagedProcess(
                WHITNEY_SERVER,
                _whitney_serve_argv(whitney_port, stack.whitney_data),
                {**env, "WHITNEY_LOCAL_API_KEYS": whitney_key},
                log_dir,
            )
        )
        stack.wait_up(PREFECT_SERVER)
        stack.wait_up(WHITNEY_SERVER)

        def cli(name: str, *argv: str, extra_env: dict[str, str] | None = None) -> str:
            return run_command(
                list(argv), {**env, **(extra_env or {})}, timeout=120, log_dir=log_dir, name=name
            )

        cli("work-pool-create", prefect, "work-pool", "create", WORK_POOL, "--type", "process")
        cli("block-register", prefect, "block", "register", "-m", "blocks")
        cli(
            "block-save",
            sys.executable,
            "-m",
            "blocks",
            "save",
            BLOCK_NAME,
            "--base-url",
            stack.whitney_url,
            extra_env={"WHITNEY_API_KEY": whitney_key},
        )
        cli("block-check", sys.executable, "-m", "blocks", "check", BLOCK_NAME)
        cli(
            "deploy",
            prefect,
            "--no-prompt",
            "deploy",
            "--all",
            "--prefect-file",
            "deployments/prefect.yaml",
        )
        stack.enable_automation(EVALUATE_TRIGGER, False)
        stack.enable_automation(RESUME_TRIGGER, False)
        stack.pause_deployment(*RESUME_SWEEP)
        for index in range(1, workers + 1):
            name = WORKER if index == 1 else f"{WORKER}-{index}"
            processes.append(
                ManagedProcess(
                    name,
                    [prefect, "worker", "start", "--pool", WORK_POOL, "--name", _worker(name)],
                    env,
                    log_dir,
                    stop_signals=(signal.SIGINT,),  # a Prefect worker ignores SIGTERM
                )
            )
            stack.wait_up(name)
        yield stack
    finally:
        for process in reversed(processes):  # the worker first, the Prefect server last
            process.stop()
        for pid in stack.orphans:  # flow runs whose worker was killed
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        api.close()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # a SIGTERM to pytest (a CI timeout) must still run the teardown that stops the stack
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    database = "postgresql" if postgres.wanted() else "sqlite"
    try:
        with running_stack(tmp_path_factory.mktemp("e2e"), database=database) as started:
            yield started
    finally:
        signal.signal(signal.SIGTERM, previous_handler)


@pytest.fixture
def alive(stack: Stack) -> Stack:
    """The stack, checked to be still running before the test."""
    try:
        stack.check_alive()
    except HarnessError as error:
        pytest.fail(f"the e2e stack is down: {error}")
    return stack


@pytest.fixture(scope="session")
def reference(stack: Stack) -> Any:
    """test_resume.Reference: one undisturbed run of test_resume's CONFIG for the session,
    which test_resume.py and test_resume_burst.py compare their runs with."""
    from .test_resume import Reference

    return Reference(stack)
