"""deployments/stack.sh, as docs/prefect-server.md ("The stack on PostgreSQL") has a user run
it, on free ports and a state directory of its own: `status` before says nothing runs; `up`
starts PostgreSQL, the Prefect server on it, Whitney and two workers, and sets up the pool,
block and deployments (two workers online in the API, the block answering, rl-on-demand
deployed, the server's database PostgreSQL); a second `up` starts nothing; no secret in any
process's command line; `down` stops every PID it started, their descendants too, and `status`
says nothing runs. Skipped only where PostgreSQL is not installed, outside CI.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from . import postgres
from .harness import REPO_ROOT, children_of, free_port, pid_alive

STACK = REPO_ROOT / "deployments" / "stack.sh"
PARTS = ["postgres", "prefect-server", "whitney", "worker-1", "worker-2"]

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state directory the `postgres` user can reach (pytest's are root's alone)."""
    if postgres.bin_dir() is None and not os.environ.get("CI"):
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
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


def test_the_stack_comes_up_on_postgresql_and_goes_down_by_pid(state_dir: Path) -> None:
    prefect_port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "WHITNEY_"))},
        "WHITNEY_STACK_DIR": str(state_dir),
        "WHITNEY_STACK_PG_PORT": str(free_port()),
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
