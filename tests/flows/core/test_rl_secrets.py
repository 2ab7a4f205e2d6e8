"""The API key never reaches Prefect: not in parameters, task runs, logs or artifacts, and
not anywhere in the Prefect database."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from flowtest_records import FlowRunRecords, records_once
from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from whitney.local import EmbeddedWhitney


def prefect_database_bytes() -> bytes:
    database = Path(PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split(":///", 1)[1])
    files = [database, database.with_name(database.name + "-wal")]
    return b"".join(path.read_bytes() for path in files if path.exists())


def expected_task_runs(cycles: int, prompts: int) -> dict[str, int]:
    """Each cycle subflow run's task runs, by its name: pipelined, the first cycle saves its
    own sampler, every other one samples from the sampler its predecessor published, and each
    but the last publishes the next one; besides, two and one per prompt."""
    return {f"cycle-{n}": 2 + prompts + (n == 0) + (n != cycles - 1) for n in range(cycles)}


def test_the_api_key_is_never_recorded(whitney: EmbeddedWhitney, small_config: RLConfig) -> None:
    """Every record of this test's flow run (its subflow runs, task runs, logs and
    artifacts, all pages, filtered by its flow runs in the session's shared database), once
    all have arrived."""
    key = whitney.api_key
    state = rl_flow(small_config.model_copy(update={"cycles": 2}), return_state=True)
    result = state.result()
    expected = expected_task_runs(2, small_config.prompts_per_cycle)

    def complete(records: FlowRunRecords) -> bool:
        """Both cycles' subflow runs and all their task runs, the parent's last log line and
        the summary artifact have arrived."""
        cycles = {run.id: run.name for run in records.flow_runs[1:]}
        counts = Counter(cycles.get(task_run.flow_run_id) for task_run in records.task_runs)
        return (
            sorted(cycles.values()) == sorted(expected)
            and all(counts[name] == count for name, count in expected.items())
            and any("Finished in state Completed" in line for line in records.log_messages())
            and any((artifact.key or "").endswith("-summary") for artifact in records.artifacts)
        )

    records = records_once(state.state_details.flow_run_id, complete)
    text = "\n".join(
        row.model_dump_json()
        for rows in (records.flow_runs, records.task_runs, records.logs, records.artifacts)
        for row in rows
    )
    assert result.run_id in text  # the records are the right ones (the summary names the run)
    assert "forward_backward[seq=" in text
    assert key not in text

    database = prefect_database_bytes()
    assert result.run_id.encode() in database
    assert key.encode() not in database
