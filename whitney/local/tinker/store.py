"""Which Whitney operations each Tinker request became (`tinker.sqlite3` beside the journal).

A Tinker request is keyed by its stream (a training client's model id, or a sampling
session) and the SDK's `seq_id` in it. Its row holds the run and the run's `seq_id`s it was
given, so that a retry, even after a restart, resubmits the very same operations (which the
journal answers from their stored twins) instead of new ones.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    request_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    stream TEXT NOT NULL,
    tinker_seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq_ids TEXT NOT NULL,
    body_hash TEXT NOT NULL,
    UNIQUE (stream, tinker_seq)
);
CREATE TABLE IF NOT EXISTS run_seqs (run_id TEXT PRIMARY KEY, next_seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS aliases (
    alias TEXT PRIMARY KEY, tenant TEXT NOT NULL, run_id TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class TinkerRequest:
    request_id: str
    tenant: str
    stream: str
    tinker_seq: int
    kind: str
    run_id: str
    seq_ids: tuple[int, ...]
    body_hash: str


def _row(row: tuple) -> TinkerRequest:  # type: ignore[type-arg]
    request_id, tenant, stream, tinker_seq, kind, run_id, seq_ids, body_hash = row
    return TinkerRequest(
        request_id,
        tenant,
        stream,
        tinker_seq,
        kind,
        run_id,
        tuple(json.loads(seq_ids)),
        body_hash,
    )


class RequestStore:
    """The rows, and one lock per run that orders the allocation of its `seq_id`s."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # as the journal: a crash loses nothing
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self._run_locks: dict[str, threading.Lock] = {}

    @contextmanager
    def run_lock(self, run_id: str) -> Iterator[None]:
        """Held while a request's `seq_id`s are allocated and its operations submitted."""
        with self._lock:
            lock = self._run_locks.setdefault(run_id, threading.Lock())
        with lock:
            yield

    def find(self, stream: str, tinker_seq: int) -> TinkerRequest | None:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM requests WHERE stream = ? AND tinker_seq = ?", (stream, tinker_seq)
            ).fetchone()
        return None if row is None else _row(row)

    def get(self, request_id: str) -> TinkerRequest | None:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM requests WHERE request_id = ?", (request_id,)
            ).fetchone()
        return None if row is None else _row(row)

    def last_seq(self, stream: str) -> int:
        """The highest Tinker `seq_id` the stream has used (-1 for none)."""
        with self._lock:
            row = self._db.execute(
                "SELECT MAX(tinker_seq) FROM requests WHERE stream = ?", (stream,)
            ).fetchone()
        return -1 if row[0] is None else int(row[0])

    def next_seq(self, run_id: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT next_seq FROM run_seqs WHERE run_id = ?", (run_id,)
            ).fetchone()
        return 1 if row is None else int(row[0])

    def insert(self, request: TinkerRequest) -> None:
        """Record `request` and move its run's counter past its `seq_id`s (under `run_lock`)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    request.request_id,
                    request.tenant,
                    request.stream,
                    request.tinker_seq,
                    request.kind,
                    request.run_id,
                    json.dumps(list(request.seq_ids)),
                    request.body_hash,
                ),
            )
            self._db.execute(
                "INSERT INTO run_seqs VALUES (?, ?) ON CONFLICT (run_id) "
                "DO UPDATE SET next_seq = MAX(next_seq, excluded.next_seq)",
                (request.run_id, max(request.seq_ids) + 1),
            )
            self._db.execute("COMMIT")

    def forget(self, request: TinkerRequest) -> None:
        """Undo `insert` of a request whose operations were refused before they were journaled
        (under `run_lock`, before any later allocation)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM requests WHERE request_id = ?", (request.request_id,))
            self._db.execute(
                "UPDATE run_seqs SET next_seq = ? WHERE run_id = ?",
                (min(request.seq_ids), request.run_id),
            )
            self._db.execute("COMMIT")

    def alias(self, alias: str, tenant: str, run_id: str) -> None:
        """Let `alias` (a model id the SDK made up: `<session>:train:<n>`) name `run_id`."""
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO aliases VALUES (?, ?, ?)", (alias, tenant, run_id)
            )

    def resolve(self, tenant: str, model_id: str) -> str:
        """The run a model id names: an alias's run, else the id itself."""
        with self._lock:
            row = self._db.execute(
                "SELECT run_id FROM aliases WHERE alias = ? AND tenant = ?", (model_id, tenant)
            ).fetchone()
        return model_id if row is None else row[0]
