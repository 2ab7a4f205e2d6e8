"""The journal: sessions, runs and every operation in SQLite, written before anything executes.

Its tables, read and written; the file, its schema and its one connection:
`whitney/local/journal_store.py`.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from datetime import UTC, datetime
from typing import Any

import pydantic_core

from whitney.errors import NonFiniteResult
from whitney.local.journal_store import JournalStore


def utcnow() -> str:
    """Now, as ISO 8601 UTC with microseconds (what every timestamp in the journal is)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def iso_time(epoch_s: float) -> str:
    """A Unix time as the journal's timestamps are written."""
    stamp = datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="microseconds")
    return stamp.replace("+00:00", "Z")


def canonical_json(value: Any) -> str:
    """The canonical form compared for exactly-once: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def canonical_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


NON_FINITE_TOKENS = ("NaN", "Infinity")


def _refuse_constant(token: str) -> Any:
    raise NonFiniteResult(
        f"the operation's result holds a non-finite number ({token}), which JSON cannot carry",
        details={"quantity": "result"},
    )


def fast_json(value: Any) -> str:
    """Compact strict JSON of an engine result (pydantic-core's serialiser: several times faster
    than `json.dumps` on long float lists). A non-finite float raises `NonFiniteResult`: the text
    is parsed strictly again only when it holds a NaN / Infinity token (perhaps inside a string)."""
    text = pydantic_core.to_json(value, inf_nan_mode="constants").decode()
    if any(token in text for token in NON_FINITE_TOKENS):
        json.loads(text, parse_constant=_refuse_constant)
    return text


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), allow_nan=False)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _str(value: str | None) -> str:
    return "null" if value is None else json.dumps(value)


def render_operation(row: sqlite3.Row) -> str:
    """An operation row as the wire's Operation JSON, splicing the stored JSON texts."""
    return (
        f'{{"run_id":{_str(row["run_id"])},"seq_id":{int(row["seq_id"])},'
        f'"kind":{_str(row["kind"])},"sampler_id":{_str(row["sampler_id"])},'
        f'"status":{_str(row["status"])},"result":{row["result"] or "null"},'
        f'"error":{row["error"] or "null"},"usage":{row["usage"] or "{}"},'
        f'"submitted_at":{_str(row["submitted_at"])},"started_at":{_str(row["started_at"])},'
        f'"finished_at":{_str(row["finished_at"])}}}'
    )


def operation_dict(row: sqlite3.Row) -> dict[str, Any]:
    """An operation row as a dict (what `render_operation` writes, parsed)."""
    return json.loads(render_operation(row))


def run_out(run: dict[str, Any]) -> dict[str, Any]:
    """A run (`Journal.get_run`) as the API answers it."""
    return {
        "run_id": run["run_id"],
        "session_id": run["session_id"],
        "provider": run["provider"],
        "base_model": run["base_model"],
        "lora_rank": run["lora_rank"],
        "role": run["role"],
        "trainable": run["trainable"],
        "status": run["status"],
        "next_seq_id": run["next_seq_id"],
        "step": run["step"],
        "error": run["error"],
        "created_at": run["created_at"],
        "finished_at": run["finished_at"],
        "seed": run["seed"],
        "from_checkpoint": run["from_checkpoint"],
        "labels": run["labels"],
        "trained_at": run.get("trained_at"),
    }


def session_out(session: dict[str, Any], run_ids: list[str] | None) -> dict[str, Any]:
    """A session (`Journal.get_session`) as the API answers it, with its runs if given."""
    out = {key: value for key, value in session.items() if key != "tenant"}
    if run_ids is not None:
        out["run_ids"] = run_ids
    return out


def _session(row: sqlite3.Row) -> dict[str, Any]:
    """A session row as a dict (its labels parsed, its lease an ISO time)."""
    lease = row["lease_expires_at"]
    return {
        "session_id": row["session_id"],
        "tenant": row["tenant"],
        "status": row["status"],
        "labels": _loads(row["labels"]),
        "created_at": row["created_at"],
        "lease_expires_at": None if lease is None else iso_time(lease),
        "closed_reason": row["closed_reason"],
    }


class Journal(JournalStore):
    """Typed access to the journal's tables: sessions, runs, operations, checkpoints,
    artifacts and idempotency keys (the file and its connection: `JournalStore`)."""

    # ----------------------------------------------------------------- recovery

    def active_runs(self) -> list[dict[str, Any]]:
        """The runs an earlier process left non-terminal, oldest first (full rows)."""
        rows = self._all(
            "SELECT run_id FROM runs WHERE status IN ('allocating','ready','finishing',"
            "'cancelling') ORDER BY created_at, run_id"
        )
        return [run for row in rows if (run := self.get_run(row["run_id"])) is not None]

    def requeue_interrupted(self, run_id: str) -> list[str]:
        """The run's operations a dead process left `running` go back to `pending`: their
        execution never committed (nothing of it survives), so it is counted `interrupted`,
        not in `executions`. Their checkpoint and artifact rows, written just before the
        result, go too; returns the paths of those artifacts' files, for the caller to
        delete."""
        uncommitted = (
            " WHERE run_id=? AND seq_id NOT IN (SELECT seq_id FROM operations WHERE run_id=?"
            " AND status='succeeded')"
        )
        with self.transaction() as conn:
            conn.execute(
                "UPDATE operations SET status='pending', started_at=NULL,"
                " executions=executions-1, interrupted=interrupted+1"
                " WHERE run_id=? AND status='running'",
                (run_id,),
            )
            orphans = [
                row["path"]
                for row in conn.execute("SELECT path FROM artifacts" + uncommitted, (run_id,) * 2)
            ]
            conn.execute("DELETE FROM artifacts" + uncommitted, (run_id, run_id))
            conn.execute("DELETE FROM checkpoints" + uncommitted, (run_id, run_id))
        return orphans

    def replay_rows(self, run_id: str) -> list[sqlite3.Row]:
        """Every operation of the run in seq order, with its payload and result texts."""
        return self._all(
            "SELECT seq_id, kind, sampler_id, payload, status, result, submitted_at"
            " FROM operations WHERE run_id=? ORDER BY seq_id",
            (run_id,),
        )

    def end_unrecoverable(self, run_id: str, status: str, error: dict[str, Any]) -> None:
        """End a run that cannot go on after a restart: its operations that never finished
        end `cancelled` with `error`, the run `status` (`cancelled` or `failed`) with it."""
        now = utcnow()
        with self.transaction() as conn:
            conn.execute(
                "UPDATE operations SET status='cancelled', finished_at=?, error=?"
                " WHERE run_id=? AND status IN ('pending','running')",
                (now, _dumps(error), run_id),
            )
            conn.execute(
                "UPDATE runs SET status=?, error=?, finished_at=? WHERE run_id=?",
                (status, None if status == "cancelled" else _dumps(error), now, run_id),
            )

    # ----------------------------------------------------------------- sessions

    def insert_session(
        self, session_id: str, tenant: str, labels: dict[str, str], lease_expires_at: float | None
    ) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO sessions (session_id, tenant, status, labels, created_at,"
                " lease_expires_at) VALUES (?, ?, 'open', ?, ?, ?)",
                (session_id, tenant, _dumps(labels), utcnow(), lease_expires_at),
            )
            conn.executemany(
                "INSERT INTO session_labels (session_id, key, value) VALUES (?, ?, ?)",
                [(session_id, key, value) for key, value in labels.items()],
            )

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM sessions WHERE session_id=?", (session_id,))
        return None if row is None else _session(row)

    def list_sessions(self, tenant: str, labels: list[tuple[str, str]]) -> list[dict[str, Any]]:
        sql = "SELECT s.* FROM sessions s WHERE s.tenant=?"
        params: list[Any] = [tenant]
        for key, value in labels:
            sql += (
                " AND EXISTS (SELECT 1 FROM session_labels l WHERE l.session_id=s.session_id"
                " AND l.key=? AND l.value=?)"
            )
            params += [key, value]
        sql += " ORDER BY s.created_at, s.session_id"
        return [_session(row) for row in self._all(sql, params)]

    def every_session(self) -> list[dict[str, Any]]:
        """Every tenant's sessions, oldest first."""
        rows = self._all("SELECT * FROM sessions ORDER BY created_at, session_id")
        return [_session(row) for row in rows]

    def close_session(self, session_id: str, reason: str) -> None:
        self._write(
            "UPDATE sessions SET status='closed', closed_at=?, closed_reason=?"
            " WHERE session_id=? AND status='open'",
            (utcnow(), reason, session_id),
        )

    def renew_lease(self, session_id: str, expires_at: float | None) -> bool:
        """Move an open session's lease to `expires_at`; False if it is closed."""
        return bool(
            self._write(
                "UPDATE sessions SET lease_expires_at=? WHERE session_id=? AND status='open'",
                (expires_at, session_id),
            )
        )

    def renew_open_leases(self, expires_at: float | None) -> None:
        """Every open session's lease to `expires_at` (a restarted server's grace)."""
        self._write("UPDATE sessions SET lease_expires_at=? WHERE status='open'", (expires_at,))

    def expired_sessions(self, now: float) -> list[str]:
        """The open sessions whose lease ended before `now` (a Unix time)."""
        rows = self._all(
            "SELECT session_id FROM sessions WHERE status='open'"
            " AND lease_expires_at IS NOT NULL AND lease_expires_at < ?",
            (now,),
        )
        return [row["session_id"] for row in rows]

    def session_run_ids(self, session_id: str) -> list[str]:
        rows = self._all(
            "SELECT run_id FROM runs WHERE session_id=? ORDER BY created_at, run_id", (session_id,)
        )
        return [row["run_id"] for row in rows]

    # ----------------------------------------------------------------- runs

    def insert_run(self, run: dict[str, Any]) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO runs (run_id, tenant, session_id, provider, base_model, lora_rank,"
                " seed, role, trainable, from_checkpoint, labels, status, step, created_at,"
                " trained_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run["run_id"],
                    run["tenant"],
                    run["session_id"],
                    run["provider"],
                    run["base_model"],
                    run["lora_rank"],
                    run["seed"],
                    run["role"],
                    1 if run["trainable"] else 0,
                    run["from_checkpoint"],
                    _dumps(run["labels"]),
                    run["status"],
                    run.get("step", 0),
                    utcnow(),
                    run.get("trained_at"),
                ),
            )

    def delete_run(self, run_id: str) -> None:
        self._write("DELETE FROM runs WHERE run_id=?", (run_id,))

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM runs WHERE run_id=?", (run_id,))
        if row is None:
            return None
        run = {key: row[key] for key in row.keys()}  # noqa: SIM118 - sqlite3.Row
        run["trainable"] = bool(run["trainable"])
        run["labels"] = _loads(run["labels"])
        run["error"] = _loads(run["error"])
        nxt = self._one("SELECT MAX(seq_id) AS m FROM operations WHERE run_id=?", (run_id,))
        run["next_seq_id"] = (nxt["m"] or 0) + 1
        return run

    def set_run_status(
        self, run_id: str, status: str, *, error: dict[str, Any] | None = None
    ) -> None:
        finished = utcnow() if status in ("finished", "cancelled", "failed") else None
        self._write(
            "UPDATE runs SET status=?, error=COALESCE(?, error),"
            " finished_at=COALESCE(?, finished_at) WHERE run_id=?",
            (status, _dumps(error), finished, run_id),
        )

    def set_run_step(self, run_id: str, step: int) -> None:
        self._write("UPDATE runs SET step=? WHERE run_id=?", (step, run_id))

    # ----------------------------------------------------------------- operations

    def insert_operation(
        self,
        run_id: str,
        seq_id: int,
        kind: str,
        sampler_id: str | None,
        payload_hash: str,
        payload_json: str,
    ) -> str:
        """Journal a `pending` operation (its canonical payload text); its submitted_at."""
        now = utcnow()
        self._write(
            "INSERT INTO operations (run_id, seq_id, kind, sampler_id, payload_hash, payload,"
            " status, usage, submitted_at) VALUES (?, ?, ?, ?, ?, ?, 'pending', '{}', ?)",
            (run_id, seq_id, kind, sampler_id, payload_hash, payload_json, now),
        )
        return now

    def get_operation_header(self, run_id: str, seq_id: int) -> dict[str, Any] | None:
        """kind, sampler_id, payload_hash and status: what a resend is compared against."""
        row = self._one(
            "SELECT kind, sampler_id, payload_hash, status FROM operations"
            " WHERE run_id=? AND seq_id=?",
            (run_id, seq_id),
        )
        return None if row is None else dict(row)

    def get_operation(self, run_id: str, seq_id: int) -> sqlite3.Row | None:
        """The operation's row; `result`, `error` and `usage` are JSON text (see render)."""
        return self._one(
            "SELECT run_id, seq_id, kind, sampler_id, status, result, error, usage, executions,"
            " submitted_at, started_at, finished_at FROM operations WHERE run_id=? AND seq_id=?",
            (run_id, seq_id),
        )

    def list_operations(self, run_id: str, after_seq: int, limit: int) -> list[sqlite3.Row]:
        return self._all(
            "SELECT run_id, seq_id, kind, sampler_id, status, result, error, usage, executions,"
            " submitted_at, started_at, finished_at FROM operations"
            " WHERE run_id=? AND seq_id>? ORDER BY seq_id LIMIT ?",
            (run_id, after_seq, limit),
        )

    def payloads(self, run_id: str, kind: str) -> dict[int, dict[str, Any]]:
        """The stored payloads of the run's `kind` operations, by seq_id."""
        rows = self._all(
            "SELECT seq_id, payload FROM operations WHERE run_id=? AND kind=?", (run_id, kind)
        )
        return {row["seq_id"]: json.loads(row["payload"]) for row in rows}

    def names_in_use(self, run_id: str, kind: str) -> dict[str, int]:
        """Explicit `name`s of the run's journaled `kind` operations -> their seq_id."""
        rows = self._all(
            "SELECT seq_id, json_extract(payload, '$.name') AS name FROM operations"
            " WHERE run_id=? AND kind=? AND json_extract(payload, '$.name') IS NOT NULL",
            (run_id, kind),
        )
        return {row["name"]: row["seq_id"] for row in rows}

    def mark_running(self, run_id: str, seq_ids: list[int]) -> str:
        now = utcnow()
        with self.transaction() as conn:
            conn.executemany(
                "UPDATE operations SET status='running', started_at=?, executions=executions+1"
                " WHERE run_id=? AND seq_id=?",
                [(now, run_id, seq) for seq in seq_ids],
            )
        return now

    def finish_operation(
        self,
        run_id: str,
        seq_id: int,
        status: str,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        usage: dict[str, int] | None = None,
    ) -> str:
        now = utcnow()
        self._write(
            "UPDATE operations SET status=?, result=?, error=?, usage=?, finished_at=?"
            " WHERE run_id=? AND seq_id=?",
            (
                status,
                None if result is None else fast_json(result),
                _dumps(error),
                _dumps(usage or {}),
                now,
                run_id,
                seq_id,
            ),
        )
        return now

    # ----------------------------------------------------------------- checkpoints, artifacts

    def insert_checkpoint(self, run_id: str, name: str, seq_id: int, step: int, path: str) -> None:
        self._write(
            "INSERT INTO checkpoints (run_id, name, seq_id, step, path, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, name, seq_id, step, path, utcnow()),
        )

    def get_checkpoint(self, run_id: str, name: str) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM checkpoints WHERE run_id=? AND name=?", (run_id, name))
        return None if row is None else dict(row)

    def tenant_samplers(self, tenant: str) -> list[dict[str, Any]]:
        """(run_id, sampler_id, finished_at) of every sampler the tenant's runs saved."""
        rows = self._all(
            "SELECT o.run_id, json_extract(o.result, '$.sampler_id') AS sampler_id, o.finished_at"
            " FROM operations o JOIN runs r ON r.run_id = o.run_id"
            " WHERE r.tenant=? AND o.kind='save_weights_for_sampler' AND o.status='succeeded'"
            " ORDER BY o.finished_at, o.run_id, o.seq_id",
            (tenant,),
        )
        return [dict(row) for row in rows]

    def tenant_checkpoints(self, tenant: str) -> list[dict[str, Any]]:
        """(run_id, name, created_at) of every checkpoint the tenant's runs saved."""
        rows = self._all(
            "SELECT c.run_id, c.name, c.created_at FROM checkpoints c"
            " JOIN runs r ON r.run_id = c.run_id WHERE r.tenant=?"
            " ORDER BY c.created_at, c.run_id, c.name",
            (tenant,),
        )
        return [dict(row) for row in rows]

    def insert_artifact(self, artifact: dict[str, Any]) -> None:
        self._write(
            "INSERT INTO artifacts (artifact_id, tenant, run_id, seq_id, path, format, sha256,"
            " bytes, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                artifact["artifact_id"],
                artifact["tenant"],
                artifact["run_id"],
                artifact["seq_id"],
                artifact["path"],
                artifact["format"],
                artifact["sha256"],
                artifact["bytes"],
                utcnow(),
            ),
        )

    def get_artifact(self, artifact_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM artifacts WHERE artifact_id=?", (artifact_id,))
        return None if row is None else dict(row)

    # ----------------------------------------------------------------- idempotency

    def get_idempotent(self, tenant: str, scope: str, key: str) -> dict[str, Any] | None:
        row = self._one(
            "SELECT body_hash, resource_id FROM idempotency WHERE tenant=? AND scope=? AND key=?",
            (tenant, scope, key),
        )
        return None if row is None else dict(row)

    def put_idempotent(
        self, tenant: str, scope: str, key: str, body_hash: str, resource_id: str
    ) -> None:
        self._write(
            "INSERT INTO idempotency (tenant, scope, key, body_hash, resource_id, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (tenant, scope, key, body_hash, resource_id, utcnow()),
        )
