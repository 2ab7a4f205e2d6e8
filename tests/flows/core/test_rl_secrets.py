"""The API key never reaches Prefect: not in parameters, task runs, logs or artifacts, and
not anywhere in the Prefect database."""

from __future__ import annotations

import time
from pathlib import Path

from flowtest_helpers import subflow_runs, task_runs_of
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from whitney.local import EmbeddedWhitney


def prefect_database_bytes() -> bytes:
    database = Path(PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split(":///", 1)[1])
    files = [database, database.with_name(database.name + "-wal")]
    return b"".join(path.read_bytes() for path in files if path.exists())


def test_the_api_key_is_never_recorded(whitney: EmbeddedWhitney, small_config: RLConfig) -> None:
    key = whitney.api_key
    state = rl_flow(small_config.model_copy(update={"cycles": 2}), return_state=True)
    result = state.result()
    flow_run_id = state.state_details.flow_run_id
    cycles = subflow_runs(flow_run_id)
    for cycle in cycles:
        # pipelined: the first cycle saves its own sampler, every other one samples from the
        # sampler its predecessor published, and each but the last publishes the next one
        first, last = cycle.name == "cycle-0", cycle.name == f"cycle-{len(cycles) - 1}"
        expected = 2 + small_config.prompts_per_cycle + first + (not last)
        assert len(task_runs_of(cycle.id, expected=expected)) == expected
    APILogWorker.drain_all()
    time.sleep(1.0)

    with get_client(sync_client=True) as prefect:
        run_ids = [flow_run_id, *(cycle.id for cycle in cycles)]
        records = [
            prefect.read_flow_run(flow_run_id).model_dump_json(),
            *(cycle.model_dump_json() for cycle in cycles),
            *(
                task_run.model_dump_json()
                for run_id in run_ids
                for task_run in prefect.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
                )
            ),
            *(artifact.model_dump_json() for artifact in prefect.read_artifacts()),
            *(log.model_dump_json() for log in prefect.read_logs(log_filter=LogFilter())),
        ]
    text = "\n".join(records)
    assert result.run_id in text  # the records are the right ones (the summary names the run)
    assert "forward_backward[seq=" in text
    assert key not in text

    database = prefect_database_bytes()
    assert result.run_id.encode() in database
    assert key.encode() not in database
