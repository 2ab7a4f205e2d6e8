"""deployments/stack.sh, as docs/prefect-server.md ("The stack on PostgreSQL") has a user run
it, on free ports and a state directory of its own: `status` before says nothing runs; `up`
starts PostgreSQL, Redis, the Prefect server on them, Whitney and two workers, and sets up the
pool, block and deployments (two workers online in the API, the block answering, rl-on-demand
deployed, the server's database PostgreSQL, its events in Redis's stream); a second `up`
starts nothing; no secret in any process's command line; a run in flight through a SIGKILL of
the Prefect server and the `up` that starts it again completes, every state of its flow runs
with its state event (counted); `down` stops every PID it started, Redis's and the
descendants too, and `status` says nothing runs. Skipped only where PostgreSQL or Redis
(redis-server, prefect-redis) is not installed, outside CI.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import httpx
import pytest

from . import postgres, redis_broker
from .harness import (
    REPO_ROOT,
    HarnessError,
    PrefectAPI,
    children_of,
    free_port,
    pid_alive,
    wait_for,
)
from .state_events import states_and_events
from .test_deployments import SMALL

STACK = REPO_ROOT / "deployments" / "stack.sh"
PARTS = ["postgres", "redis", "prefect-server", "whitney", "worker-1", "worker-2"]
STALL_AUTOMATIONS = "whitney-flows-cancel-stalled-cycle-"

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state directory the `postgres` user can reach (pytest's are root's alone)."""
    if postgres.bin_dir() is None and not os.environ.get("CI"):
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    if not redis_broker.installed() and not os.environ.get("CI"):
        pytest.skip(
            "Redis is not installed (apt-get install redis-server; pip install -e '.[redis]')"
        )
    path = Path(tempfile.mkdtemp(prefix="whitney-stack-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def stack(command: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(STACK), command], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"stack.sh {command}: {done.stdout}\n{done.stderr}"
    return done.stdout


def statuses(text: str) -> dict[str, int | None]:
    """Each part of `status`'s answer: its PID, or None when it is not running."""
    found: dict[str, int | None] = {}
    for line in text.splitlines():
        name, rest = line.split(": ", 1)
        match = re.match(r"running \(pid (\d+)", rest)
        assert match or rest == "not running", line
        found[name] = int(match.group(1)) if match else None
    return found


def command_lines() -> str:
    """Every process's command line, as `ps` shows them."""
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return "\n".join(lines)


def stored_deployments(password: str, env: dict[str, str]) -> list[str]:
    """rl-on-demand as the PostgreSQL database holds it (the Prefect server's own)."""

    async def query() -> list[str]:
        connection = await asyncpg.connect(
            host="127.0.0.1",
            port=int(env["WHITNEY_STACK_PG_PORT"]),
            user=postgres.DB_USER,
            password=password,
            database=postgres.DB_NAME,
        )
        try:
            rows = await connection.fetch(
                "SELECT name FROM deployment WHERE name = $1", "rl-on-demand"
            )
        finally:
            await connection.close()
        return [row["name"] for row in rows]

    return asyncio.run(query())


def redis_streams(password: str, env: dict[str, str]) -> list[bytes]:
    """The keys Redis holds (the Prefect server's streams)."""
    import redis

    client = redis.Redis(port=int(env["WHITNEY_STACK_REDIS_PORT"]), password=password)
    try:
        return sorted(client.keys())
    finally:
        client.close()


def survives_a_prefect_server_kill(api: PrefectAPI, env: dict[str, str]) -> None:
    """A run of rl-on-demand, the stall automations off: the Prefect server is SIGKILLed (its
    process group) once two of the run's four cycles are done, `up` starts it again alone, and
    the run completes with every state of its flow runs and their state events stored."""
    for automation in api.post("/automations/filter", json={}):
        # a cycle whose stall window (15 s on local/tiny) passes in the outage is cancelled
        if automation["name"].startswith(STALL_AUTOMATIONS):
            api._call("PATCH", f"/automations/{automation['id']}", json={"enabled": False})
    since = datetime.now(UTC).isoformat()
    deployment = api.deployment("rl", "rl-on-demand")
    root = api.create_flow_run_from_deployment(
        deployment["id"],
        {"config": {**SMALL, "cycles": 4}, "whitney_block": "whitney"},
        "through a Prefect server kill",
    )["id"]

    def cycles_done() -> bool:
        cycles = api.child_flow_runs(root)
        return sum(cycle["state_type"] == "COMPLETED" for cycle in cycles) >= 2

    wait_for("two cycles to complete", cycles_done, 600)
    server = statuses(stack("status", env))["prefect-server"]
    assert server
    os.killpg(server, signal.SIGKILL)
    wait_for("the Prefect server to die", lambda: not pid_alive(server), 30)
    again = stack("up", env)
    assert "prefect server started" in again and again.count("already running") == len(PARTS) - 1
    api.wait_flow_run(root, ["COMPLETED"], 900)
    flow_runs = [  # not the runs the deployments' schedules create (no state event)
        run
        for run in api._every_page(
            "/flow_runs/filter", {"flow_runs": {"expected_start_time": {"after_": since}}}
        )
        if not run.get("auto_scheduled")
    ]
    counted = states_and_events(api, flow_runs, since)

    def all_stored() -> bool:  # the persister writes what the restart left in Redis
        counted.update(states_and_events(api, flow_runs, since))
        return counted["events"] == counted["states"]

    with contextlib.suppress(HarnessError):
        wait_for("every state event", all_stored, 60)
    print(f"through the kill: {len(flow_runs)} flow runs, {counted}")
    assert len(flow_runs) >= 5 and counted["states"] >= 15, (flow_runs, counted)
    assert counted["events"] == counted["states"] and not counted["missing"], counted


def test_the_stack_comes_up_on_postgresql_and_goes_down_by_pid(state_dir: Path) -> None:
    prefect_port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "WHITNEY_"))},
        "WHITNEY_STACK_DIR": str(state_dir),
        "WHITNEY_STACK_PG_PORT": str(free_port()),
        "WHITNEY_STACK_REDIS_PORT": str(free_port()),
        "WHITNEY_STACK_PREFECT_PORT": str(prefect_port),
        "WHITNEY_STACK_WHITNEY_PORT": str(free_port()),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
    }
    assert statuses(stack("status", env)) == dict.fromkeys(PARTS)
    started: dict[str, int | None] = {}
    try:
        print(stack("up", env))
        started = statuses(stack("status", env))
        assert set(started) == set(PARTS) and all(started.values()), started
        assert all(pid_alive(pid) for pid in started.values() if pid), started
        again = stack("up", env)
        assert "started" not in again and again.count("already running") == len(PARTS), again

        secrets = dict(
            line.split("=", 1) for line in (state_dir / "secrets").read_text().splitlines()
        )
        assert (state_dir / "secrets").stat().st_mode & 0o077 == 0
        shown = command_lines()
        assert all(value not in shown for value in secrets.values()), "a secret in argv"

        api = f"http://127.0.0.1:{prefect_port}/api"
        workers = httpx.post(f"{api}/work_pools/whitney-process/workers/filter", json={}).json()
        online = sorted(w["name"] for w in workers if w["status"] == "ONLINE")
        assert online == ["stack-worker-1", "stack-worker-2"], workers
        deployment = httpx.get(f"{api}/deployments/name/rl/rl-on-demand").json()
        assert deployment["work_pool_name"] == "whitney-process", deployment
        assert stored_deployments(secrets["PG_PASSWORD"], env) == ["rl-on-demand"]
        check = subprocess.run(
            [sys.executable, "-m", "blocks", "check", "whitney"],
            env={**env, "PREFECT_API_URL": api, "PREFECT_HOME": str(state_dir / "prefect-home")},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        assert b"events" in redis_streams(secrets["REDIS_PASSWORD"], env)
        client = PrefectAPI(api)
        try:
            survives_a_prefect_server_kill(client, env)
        finally:
            client.close()
        started = statuses(stack("status", env))
    finally:
        descendants = {
            child
            for pid in started.values()
            if pid and pid_alive(pid)
            for child in children_of(pid)
        }
        print(stack("down", env))
    assert statuses(stack("status", env)) == dict.fromkeys(PARTS)
    gone = {pid for pid in started.values() if pid} | descendants
    assert gone and not [pid for pid in gone if pid_alive(pid)], "a process outlived `down`"
