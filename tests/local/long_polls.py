"""Long-polls known to be held by the server, without sleeping: the tenant's long-poll cap
is set to the number of long-polls the test holds, so one more (a probe of a hundredth of a
second) is refused 429 exactly when all of them wait on the server. A held long-poll refused
while a probe briefly takes its slot asks again."""

from __future__ import annotations

import time

import httpx

PROBE_WAIT_S = 0.01


def op_path(run_id: str, seq_id: int) -> str:
    return f"/v1/training/runs/{run_id}/operations/{seq_id}"


def long_poll(client: httpx.Client, run_id: str, seq_id: int, wait_s: float) -> httpx.Response:
    """The operation, long-polled for `wait_s`; asked again while the tenant's long-poll cap
    refuses it (429: a probe holds the last slot for a moment)."""
    while True:
        response = client.get(op_path(run_id, seq_id), params={"wait_s": wait_s})
        if response.status_code != 429:
            return response


def until_held(client: httpx.Client, run_id: str, seq_id: int, timeout_s: float = 60) -> None:
    """Return once the tenant's long-poll cap is full, i.e. a probe long-poll is refused 429;
    fail past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while client.get(op_path(run_id, seq_id), params={"wait_s": PROBE_WAIT_S}).status_code != 429:
        assert time.monotonic() < deadline, "the long-polls were never all held"
