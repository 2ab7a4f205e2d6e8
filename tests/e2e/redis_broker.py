"""A Redis of its own for a Prefect server's events: `redis-server` on 127.0.0.1:<free port>
started by PID from a 0600 config file in a fresh directory (its password there, never on a
command line), its append-only file in that directory.

The Prefect server gets `REDIS_BROKER_SETTINGS` and the connection in its environment
(`Redis.server_env`). deployments/stack.sh sets up the same for people.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from flows.core.orchestration.prefect_env import REDIS_BROKER_SETTINGS

from .harness import HarnessError, ManagedProcess, free_port, wait_for


@dataclass
class Redis:
    """A running Redis: its process, port and password."""

    process: ManagedProcess
    port: int
    password: str = field(repr=False)

    @property
    def server_env(self) -> dict[str, str]:
        """What a Prefect server needs to keep its events in this Redis (holds the password)."""
        return {
            **REDIS_BROKER_SETTINGS,
            "PREFECT_REDIS_MESSAGING_HOST": "127.0.0.1",
            "PREFECT_REDIS_MESSAGING_PORT": str(self.port),
            "PREFECT_REDIS_MESSAGING_PASSWORD": self.password,
        }

    def ping(self) -> bool:
        """Whether it answers an authenticated PING."""
        import redis

        client = redis.Redis(port=self.port, password=self.password, socket_timeout=2)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()


def installed() -> bool:
    """Whether `redis-server` and prefect-redis are there."""
    try:
        import prefect_redis  # noqa: F401
    except ImportError:
        return False
    return shutil.which("redis-server") is not None


@contextmanager
def running_redis(log_dir: Path) -> Iterator[Redis]:
    """A new Redis in a temporary directory, stopped by PID and removed on exit."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise HarnessError("Redis is not installed (no redis-server): apt-get install redis-server")
    root = Path(tempfile.mkdtemp(prefix="whitney-redis-"))
    password = secrets.token_hex(24)
    port = free_port()
    config = root / "redis.conf"
    config.touch(mode=0o600)
    config.write_text(
        f"bind 127.0.0.1\nport {port}\nrequirepass {password}\ndir {root}\n"
        'appendonly yes\nappendfsync everysec\nsave ""\ndaemonize no\n'
    )
    process = None
    try:
        process = ManagedProcess("redis", [binary, str(config)], {}, log_dir, cwd=root)
        redis = Redis(process, port, password)

        def answers() -> bool:
            process.check_running()
            return redis.ping()

        wait_for("Redis to answer", answers, 60, evidence=process.tail)
        yield redis
    finally:
        if process is not None:
            process.stop(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
