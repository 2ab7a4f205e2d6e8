"""The project's Prefect settings, in one place: `whitney-flows run` and the benchmarks set
`PREFECT_ENV_DEFAULTS` for the ephemeral Prefect server (a user's own environment wins), the
e2e stack starts `prefect server start` with `SERVER_SETTINGS`, and docs/prefect-server.md
exports them before its `prefect server start`. No Prefect import: it is read before Prefect
is.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

SERVER_SETTINGS: dict[str, str] = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "50",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "200",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_READ_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_EVENTS_CAUSAL_ORDERING": "flows.core.orchestration.prefect_ordering",
}
"""The Prefect server writes task runs and events in batches, once a second, instead of one
SQLite transaction per task-run event (Prefect 3.9: batches of 1, and of 20 events every 5 s):
half its CPU per flow cycle, and none of the "database is locked" stalls of issue 12. A task
run then reaches the API up to a second after its event (the recorder rounds its interval
down to whole seconds, and 0 would spin), so the e2e tests wait for the task runs they read;
flow runs, artifacts and logs are not batched, and `whitney-flows inspect` reads Whitney. The
read batch sizes matter with a Redis broker; the in-memory one ignores them. The causal
ordering (`flows.core.orchestration.prefect_ordering`) lets the automations see at once a state
event whose
leader the server received before it was started again (Prefect's would hold it 15 minutes:
a run crashed across a restart would be resumed that late)."""

REDIS_BROKER_SETTINGS: dict[str, str] = {
    "PREFECT_MESSAGING_BROKER": "flows.core.orchestration.prefect_redis_broker",
    "PREFECT_MESSAGING_CACHE": "flows.core.orchestration.prefect_redis_broker",
    "PREFECT_REDIS_MESSAGING_PUBLISHER_BATCH_SIZE": "1",
    "PREFECT_REDIS_MESSAGING_CONSUMER_MIN_IDLE_TIME": "30",
}
"""A Prefect server's events through Redis streams (prefect-redis, with the acknowledgements
of `flows.core.orchestration.prefect_redis_broker`), beside `SERVER_SETTINGS`, its
connection in PREFECT_REDIS_MESSAGING_HOST, _PORT and _PASSWORD: an event the server accepted
survives its SIGKILL and is written after its restart. Each event goes to its stream as it
comes (prefect-redis would hold up to 5 for 10 s); a message handed to a consumer that died
is claimed by another after 30 s (5 s would hand the persister's held ones round again)."""

PREFECT_ENV_DEFAULTS: dict[str, str] = {
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    **SERVER_SETTINGS,
}
"""Set unless the user set them: the progress bar replaces Prefect's per-task console lines
(the Prefect API still gets every log), the ephemeral server does not phone home and batches
its writes (`SERVER_SETTINGS`), and the Prefect client sends no usage data and prints no
first-run telemetry notice; the ephemeral server may take 3 minutes to start (Prefect's 20 s
is too short for a first start, which creates and migrates its database, on a slow or busy
machine: CI once timed out there)."""


def set_prefect_env_defaults(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set each of `PREFECT_ENV_DEFAULTS` that `environ` does not set already; before
    Prefect is imported, which reads them."""
    for name, value in PREFECT_ENV_DEFAULTS.items():
        environ.setdefault(name, value)
