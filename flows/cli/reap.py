"""`whitney-flows reap`: close the Whitney sessions whose flow run is over or gone
(flows.core.orchestration.reaping). Dry run unless --apply.

    whitney-flows reap [--api-url URL] [--apply] [--json]

Whitney is `--api-url` (else WHITNEY_API_URL), the key from WHITNEY_API_KEY, probed first as
`run` does: a bad URL or key is one line and exit code 2. The flow runs are looked up in the
Prefect API the environment names (PREFECT_API_URL; none: the ephemeral one, started here, in
PREFECT_HOME, where `whitney-flows run` records its flow runs). Exit code 0, or 1 if --apply
could not close a session. Prefect is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from flows.cli.exit_codes import EXIT_BAD_CONFIG, EXIT_OK, EXIT_REAP_FAILED

if TYPE_CHECKING:
    from flows.core.orchestration.reaping import Verdict

PROG = "whitney-flows reap"


def run_reap(options: argparse.Namespace) -> int:
    """`reap`; the exit code."""
    import logging

    from prefect.settings import PREFECT_API_URL, PREFECT_HOME
    from rich.console import Console

    from blocks.endpoint import check_whitney, resolve_endpoint
    from flows.cli.run import prefect_start_failure, start_ephemeral_prefect
    from flows.core.config import ConfigError
    from flows.core.orchestration.reaping import reap, survey
    from whitney.client import API_URL_ENV

    try:
        endpoint = resolve_endpoint(options.api_url, url_field="--api-url")
        if endpoint is None:
            raise ConfigError("--api-url", f"no Whitney URL: give --api-url or set {API_URL_ENV}")
        check_whitney(endpoint)
    except ConfigError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    prefect_api = PREFECT_API_URL.value() or f"ephemeral ({PREFECT_HOME.value()})"
    try:
        start_ephemeral_prefect(Console(stderr=True))
    except RuntimeError as error:
        print(f"{PROG}: {prefect_start_failure(error)}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    with endpoint.connection.get_client() as client:
        verdicts = survey(client)
        if options.apply:
            verdicts = reap(client, verdicts, logging.getLogger("whitney_flows.reap"))
    report = reap_report(verdicts, prefect_api, options.apply)
    if options.json:
        print(json.dumps(report, indent=2))
    else:
        render_reap_report(report, Console())
    return EXIT_REAP_FAILED if report["failed"] else EXIT_OK


def reap_report(verdicts: Sequence[Verdict], prefect_api: str, applied: bool) -> dict[str, Any]:
    """The verdicts and their counts, JSON-ready."""
    actions = [verdict.action for verdict in verdicts]
    return {
        "prefect_api": prefect_api,
        "applied": applied,
        "sessions": [verdict.as_dict() for verdict in verdicts],
        **{action: actions.count(action) for action in ("keep", "close", "closed", "failed")},
    }


def render_reap_report(report: dict[str, Any], console: Any) -> None:
    """The sessions' table, then what was closed or what --apply would close."""
    from rich.box import SIMPLE_HEAD
    from rich.table import Table

    table = Table(
        title=f"Whitney sessions labelled with a flow run (Prefect API: {report['prefect_api']})",
        title_justify="left",
        box=SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 2, 0, 0),
    )
    for column in ("session", "flow run", "flow run state", "action"):
        table.add_column(column, overflow="fold", no_wrap=column != "action")
    for row in report["sessions"]:
        action = row["action"] + (f": {row['error']}" if row["error"] else "")
        table.add_row(row["session_id"], row["flow_run_id"], row["state"], action)
    console.print(table)
    if report["applied"]:
        failed = f"; {report['failed']} could not be closed" if report["failed"] else ""
        console.print(f"closed {report['closed']} sessions{failed}", soft_wrap=True)
    elif report["close"]:
        console.print(f"dry run: pass --apply to close {report['close']} sessions")
    else:
        console.print("nothing to close")
