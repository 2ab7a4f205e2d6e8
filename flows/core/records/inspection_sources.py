"""Where `whitney-flows inspect` and `runs` read sessions, runs and journals: the Whitney API
(`--api-url`, the key from WHITNEY_API_KEY), or the embedded server's data directory
(`--data-dir`, read-only, every tenant) through the server's own journal reader
(`whitney.local.journal.Journal`). No Prefect import: the commands start fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from whitney import wire
from whitney.local.journal import Journal, operation_dict, run_out, session_out

PAGE = 1000
"""Operations read from a data directory's journal at a time."""


class JournalSource(Protocol):
    """Where sessions, runs and journals are read from."""

    def sessions(self) -> list[wire.Session]: ...

    def run(self, run_id: str) -> wire.Run: ...

    def operations(self, run_id: str) -> list[wire.Operation]: ...

    def sample_prompts(self, run_id: str) -> dict[int, list[int]] | None:
        """The prompt tokens of the run's `sample` operations by seq id; None if unknown."""
        ...


class ApiJournal:
    """A Whitney endpoint, through `WhitneyClient` (the caller's sessions only)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def sessions(self) -> list[wire.Session]:
        return [self.client.get_session(s.session_id) for s in self.client.list_sessions()]

    def run(self, run_id: str) -> wire.Run:
        return self.client.get_run(run_id)

    def operations(self, run_id: str) -> list[wire.Operation]:
        return list(self.client.iter_journal(run_id))

    def sample_prompts(self, run_id: str) -> dict[int, list[int]] | None:
        return None  # the journal route answers no payloads


class RunNotFound(LookupError):
    pass


class DataDirJournal:
    """An embedded server's data directory, read-only (every tenant's sessions), each read
    through a short-lived reader of its journal."""

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir).expanduser() / "journal.sqlite3"
        if not self.path.is_file():
            raise FileNotFoundError(f"no Whitney journal at {self.path}")

    @contextmanager
    def _journal(self) -> Iterator[Journal]:
        journal = Journal(self.path, read_only=True)
        try:
            yield journal
        finally:
            journal.close()

    def sessions(self) -> list[wire.Session]:
        with self._journal() as journal:
            return [
                wire.Session.model_validate(
                    session_out(session, journal.session_run_ids(session["session_id"]))
                )
                for session in journal.every_session()
            ]

    def run(self, run_id: str) -> wire.Run:
        with self._journal() as journal:
            run = journal.get_run(run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id} in {self.path}")
        return wire.Run.model_validate(run_out(run))

    def operations(self, run_id: str) -> list[wire.Operation]:
        self.run(run_id)  # RunNotFound if it is not there
        operations: list[wire.Operation] = []
        with self._journal() as journal:
            after = 0
            while page := journal.list_operations(run_id, after, PAGE):
                operations += [wire.Operation.model_validate(operation_dict(r)) for r in page]
                after = page[-1]["seq_id"]
        return operations

    def sample_prompts(self, run_id: str) -> dict[int, list[int]] | None:
        with self._journal() as journal:
            payloads = journal.payloads(run_id, "sample")
        return {seq_id: payload["prompt"]["token_ids"] for seq_id, payload in payloads.items()}

    def artifact_file(self, artifact_id: str) -> Path | None:
        """The file an artifact (an export_lora archive) was written to; None if it is gone."""
        with self._journal() as journal:
            artifact = journal.get_artifact(artifact_id)
        path = Path(artifact["path"]) if artifact else None
        return path if path is not None and path.is_file() else None
