"""A PostgreSQL cluster of its own for a Prefect server: `initdb` into a fresh directory, the
`postgres` server on 127.0.0.1:<free port> (and a socket in that directory) started by PID,
one database `prefect` owned by a user `whitney` with a random password (scram-sha-256).

The password reaches the Prefect server in its environment (`PREFECT_API_DATABASE_CONNECTION_URL`)
and `createdb` in `PGPASSWORD`, never in a command line. As root, the cluster runs as the
`postgres` user (PostgreSQL refuses root). deployments/stack.sh sets up the same for people.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .harness import HarnessError, ManagedProcess, free_port, run_command, wait_for

POSTGRES_ENV = "WHITNEY_E2E_POSTGRES"
"""Set to 1 (or CI set): the e2e stack's Prefect server runs on PostgreSQL, not SQLite."""
DB_USER, DB_NAME = "whitney", "prefect"


def wanted() -> bool:
    """Whether the e2e stack runs on PostgreSQL: `WHITNEY_E2E_POSTGRES=1`, or CI."""
    flag = os.environ.get(POSTGRES_ENV)
    if flag is not None:
        return flag not in ("", "0", "false")
    return bool(os.environ.get("CI"))


def bin_dir() -> Path | None:
    """The directory of `initdb`, `postgres` and the client programs (Debian's, out of PATH,
    else PATH's), or None."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if versions:
        return versions[0].parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


@dataclass
class Postgres:
    """A running cluster: its server process and the URL Prefect connects with."""

    process: ManagedProcess
    port: int
    password: str = field(repr=False)

    @property
    def url(self) -> str:
        """The SQLAlchemy URL for `PREFECT_API_DATABASE_CONNECTION_URL` (holds the password)."""
        return f"postgresql+asyncpg://{DB_USER}:{self.password}@127.0.0.1:{self.port}/{DB_NAME}"


def _as_postgres_user() -> list[str]:
    """The prefix that runs a command as the `postgres` user when this process is root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise HarnessError("as root, PostgreSQL needs a `postgres` user to run as") from None
    return ["runuser", "-u", "postgres", "--"]


@contextmanager
def running_postgres(log_dir: Path) -> Iterator[Postgres]:
    """A new cluster in a temporary directory, stopped by PID and removed on exit."""
    binaries = bin_dir()
    if binaries is None:
        raise HarnessError("PostgreSQL is not installed (no initdb): apt-get install postgresql")
    prefix = _as_postgres_user()
    root = Path(tempfile.mkdtemp(prefix="whitney-pg-"))
    password = secrets.token_urlsafe(24)
    data = root / "data"
    pwfile = root / "pwfile"
    pwfile.write_text(password + "\n")
    pwfile.chmod(0o600)
    if prefix:
        shutil.chown(root, "postgres")
        shutil.chown(pwfile, "postgres")
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    port = free_port()
    process = None
    try:
        run_command(
            [
                *prefix,
                str(binaries / "initdb"),
                "-D",
                str(data),
                "-U",
                DB_USER,
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
            ],
            env,
            timeout=180,
            log_dir=log_dir,
            name="postgres-initdb",
            cwd=root,
        )
        pwfile.unlink()
        process = ManagedProcess(
            "postgres",
            [
                *prefix,
                str(binaries / "postgres"),
                "-D",
                str(data),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-k",
                str(root),
                "-c",
                "max_connections=200",
            ],
            env,
            log_dir,
            cwd=root,
            # SIGINT: PostgreSQL's fast shutdown
            stop_signals=(signal.SIGINT, signal.SIGTERM),
        )
        client_env = {**env, "PGPASSWORD": password}
        ready = [str(binaries / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)]
        wait_for(
            "PostgreSQL to accept connections",
            lambda: subprocess.run(ready, env=client_env, capture_output=True).returncode == 0,
            60,
            evidence=process.tail,
        )
        run_command(
            [
                str(binaries / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                DB_USER,
                DB_NAME,
            ],
            client_env,
            timeout=60,
            log_dir=log_dir,
            name="postgres-createdb",
        )
        yield Postgres(process, port, password)
    finally:
        if process is not None:
            process.stop(timeout=30)
        with contextlib.suppress(OSError):
            shutil.rmtree(root)
