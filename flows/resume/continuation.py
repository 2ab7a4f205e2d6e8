"""A continuation: which flow run a flow run continues, after which cycle, and why; and which
endings are worth continuing without a person.

The shape is small and shared (a resumed run, a fork): `{"parent_flow_run", "after_cycle",
"reason"}`. A continued flow run carries it as tags (`whitney.parent-flow-run:<id>`,
`whitney.after-cycle:<n>`, `whitney.reason:<reason>`, `whitney.resume-attempt:<k>`), so the
Prefect UI shows it and an automation or the next resume reads it back; the
`whitney.run.resumed` event carries it as its payload.

An ending is resumable when the flow run's process died (Crashed) or it Failed on an
infrastructure error: the orchestrator or the Whitney server unreachable after the retries,
a transport error. A run that failed on its own input (a ConfigError, a refused request, an
exception of the environment) would fail again the same way; a Cancelled run was stopped on
purpose. Neither is resumed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

PARENT_TAG = "whitney.parent-flow-run:"
AFTER_CYCLE_TAG = "whitney.after-cycle:"
REASON_TAG = "whitney.reason:"
ATTEMPT_TAG = "whitney.resume-attempt:"
LINEAGE_TAGS = (PARENT_TAG, AFTER_CYCLE_TAG, REASON_TAG, ATTEMPT_TAG)

INFRASTRUCTURE_ERRORS = frozenset(
    {
        # httpx's transport errors (the Prefect API or the Whitney server unreachable)
        "ConnectError",
        "ConnectTimeout",
        "ReadError",
        "ReadTimeout",
        "WriteError",
        "WriteTimeout",
        "PoolTimeout",
        "RemoteProtocolError",
        "NetworkError",
        "TimeoutException",
        "TransportError",
        # websockets and the OS
        "ConnectionClosedError",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "TimeoutError",
        # the Whitney client's, after its retries (whitney/errors.py)
        "Unavailable",
        "InternalError",
        "ServerError",
        "OperationTimeout",
        # flows.core.orchestration.orchestrator: Prefect stayed away longer than the run waits
        "PrefectAway",
    }
)
"""Exception class names whose failure says nothing about the run itself."""

_EXCEPTION_IN_MESSAGE = re.compile(r"encountered an exception: (?:[\w.]+\.)?(?P<name>\w+)")
_API_SERVER_ERROR = re.compile(r"^PrefectHTTPStatusError: Server error '5\d\d ")
"""The Prefect API answered 5xx after the client's retries (an overloaded or restarting
server, e.g. SQLite's "database is locked" as 503): the orchestrator's fault, not the run's.
A 4xx (a refused request) is the run's own."""


@dataclass(frozen=True)
class Continuation:
    """Which flow run this one continues, after which cycle (-1: from the start), and why."""

    parent_flow_run: str
    after_cycle: int
    reason: str
    attempt: int = 1
    """How many times in a row a run was continued after this same cycle."""

    def as_dict(self) -> dict[str, str | int]:
        return asdict(self)

    def tags(self) -> list[str]:
        return [
            f"{PARENT_TAG}{self.parent_flow_run}",
            f"{AFTER_CYCLE_TAG}{self.after_cycle}",
            f"{REASON_TAG}{self.reason}",
            f"{ATTEMPT_TAG}{self.attempt}",
        ]


def lineage_from_tags(tags: Iterable[str]) -> Continuation | None:
    """The lineage a flow run's tags carry (None: it continues nothing)."""
    found = {
        prefix: tag[len(prefix) :]
        for tag in tags
        for prefix in LINEAGE_TAGS
        if tag.startswith(prefix)
    }
    if PARENT_TAG not in found:
        return None
    return Continuation(
        parent_flow_run=found[PARENT_TAG],
        after_cycle=int(found.get(AFTER_CYCLE_TAG, "-1")),
        reason=found.get(REASON_TAG, ""),
        attempt=int(found.get(ATTEMPT_TAG, "1")),
    )


def without_lineage(tags: Iterable[str]) -> list[str]:
    """The tags, less any lineage tag (a continued run gets its own)."""
    return [tag for tag in tags if not tag.startswith(LINEAGE_TAGS)]


def resume_reason(state_type: str, message: str | None) -> str | None:
    """Why a flow run that ended in `state_type` (Prefect's StateType value) with `message`
    should be continued: `crashed` or `infrastructure:<error>`; None if it should not."""
    if state_type == "CRASHED":
        return "crashed"
    if state_type != "FAILED":
        return None
    match = _EXCEPTION_IN_MESSAGE.search(message or "")
    if match is None:
        return None
    server_error = _API_SERVER_ERROR.match((message or "")[match.start("name") :])
    if match["name"] in INFRASTRUCTURE_ERRORS or server_error:
        return f"infrastructure:{match['name']}"
    return None


def next_attempt(parent: Continuation | None, after_cycle: int) -> int:
    """The attempt number of a run continuing after `after_cycle`, whose parent carries
    `parent`: one more when the parent continued after the same cycle (no progress since),
    else 1."""
    if parent is not None and parent.after_cycle == after_cycle:
        return parent.attempt + 1
    return 1
