"""The journal's store: its SQLite schema and the one connection every thread shares.

One connection shared by every thread behind a lock: each statement is sub-millisecond, and
serialising them keeps SQLite free of `database is locked` retries. Durability: WAL with
synchronous=NORMAL, so every committed statement survives the death of the process (SIGKILL,
OOM) at any point; a power loss or kernel crash may lose the last commits (the WAL is synced
at checkpoints, not at every commit), never corrupt the journal.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    status TEXT NOT NULL,
    labels TEXT NOT NULL,
    created_at TEXT NOT NULL,
    closed_at TEXT,
    lease_expires_at REAL,
    closed_reason TEXT
);
CREATE INDEX IF NOT EXISTS sessions_tenant ON sessions (tenant, created_at);
CREATE TABLE IF NOT EXISTS session_labels (
    session_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
);
CREATE INDEX IF NOT EXISTS session_labels_kv ON session_labels (key, value);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    base_model TEXT NOT NULL,
    lora_rank INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    role TEXT NOT NULL,
    trainable INTEGER NOT NULL,
    from_checkpoint TEXT,
    labels TEXT NOT NULL,
    status TEXT NOT NULL,
    step INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    created_at TEXT NOT NULL,
    finished_at TEXT
);
CREATE INDEX IF NOT EXISTS runs_session ON runs (session_id, created_at);
CREATE TABLE IF NOT EXISTS operations (
    run_id TEXT NOT NULL,
    seq_id INTEGER NOT NULL,
    kind TEXT NOT NULL,
    sampler_id TEXT,
    payload_hash TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL,
    result TEXT,
    error TEXT,
    usage TEXT NOT NULL DEFAULT '{}',
    executions INTEGER NOT NULL DEFAULT 0,
    interrupted INTEGER NOT NULL DEFAULT 0,
    submitted_at TEXT NOT NULL,
    started_at TEXT,
    finished_at TEXT,
    PRIMARY KEY (run_id, seq_id)
);
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    seq_id INTEGER NOT NULL,
    step INTEGER NOT NULL,
    path TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (run_id, name)
);
CREATE TABLE IF NOT EXISTS artifacts (
    artifact_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq_id INTEGER NOT NULL,
    path TEXT NOT NULL,
    format TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency (
    tenant TEXT NOT NULL,
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    body_hash TEXT NOT NULL,
    resource_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant, scope, key)
);
"""


ADDED_COLUMNS = {
    "sessions": {"lease_expires_at": "REAL", "closed_reason": "TEXT"},
    "operations": {"interrupted": "INTEGER NOT NULL DEFAULT 0"},
    "runs": {"trained_at": "TEXT"},
}
"""Columns added after the first journals were written: an older journal gets them on open."""


class JournalStore:
    """The SQLite file under `data_dir/journal.sqlite3`, opened with its schema, and the
    statements run on it; `read_only`: a reader beside the server (or after it), which writes
    nothing and creates nothing."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        if read_only:
            self._conn = sqlite3.connect(
                f"file:{self.path}?mode=ro", uri=True, check_same_thread=False, timeout=10.0
            )
            self._conn.row_factory = sqlite3.Row
            return
        self._conn = sqlite3.connect(
            str(self.path), check_same_thread=False, isolation_level=None, timeout=30.0
        )
        self._conn.row_factory = sqlite3.Row
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA foreign_keys=OFF")
            self._conn.executescript(SCHEMA)
            self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """A journal written before a column of `ADDED_COLUMNS` gets it (empty or default)."""
        for table, columns in ADDED_COLUMNS.items():
            have = {row["name"] for row in self._conn.execute(f"PRAGMA table_info({table})")}
            for column, kind in columns.items():
                if column not in have:
                    self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write (BEGIN IMMEDIATE ... COMMIT) under the journal's lock."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _one(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Row | None:
        with self._lock:
            return self._conn.execute(sql, tuple(params)).fetchone()

    def _all(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, tuple(params)).fetchall()

    def _write(self, sql: str, params: Iterable[Any] = ()) -> int:
        with self._lock:
            return self._conn.execute(sql, tuple(params)).rowcount
