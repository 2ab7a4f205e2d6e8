"""Every flow-run state the Prefect API holds, against the state events its event store
holds: the count the load benchmark and the stack's restart test make."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .harness import PrefectAPI


def states_and_events(
    api: PrefectAPI, flow_runs: list[dict[str, Any]], since: str
) -> dict[str, Any]:
    """Every state of these flow runs the API holds, how many of them have their
    `prefect.flow-run.<state name>` event in the event store, and the first ten that have not."""
    events: Counter[tuple[str, str]] = Counter()
    page = api.post(
        "/events/filter",
        json={
            "filter": {"occurred": {"since": since}, "event": {"prefix": ["prefect.flow-run."]}},
            "limit": 50,
        },
    )
    while True:
        for event in page["events"]:
            events[(event["resource"]["prefect.resource.id"], event["event"])] += 1
        if not page.get("next_page"):
            break
        page = api.http.get(page["next_page"]).json()
    states = delivered = 0
    missing: list[str] = []
    for run in flow_runs:
        history = api.get("/flow_run_states/", params={"flow_run_id": run["id"]})
        wanted: Counter[tuple[str, str]] = Counter(
            (f"prefect.flow-run.{run['id']}", f"prefect.flow-run.{state['name']}")
            for state in history
        )
        states += sum(wanted.values())
        delivered += sum(min(n, events[key]) for key, n in wanted.items())
        missing += [f"{run['name']}: {key[1]}" for key, n in wanted.items() if events[key] < n]
    return {"states": states, "events": delivered, "missing": missing[:10]}
