"""A sweep on the real Prefect stack: the sweep-on-demand deployment, triggered as the UI
triggers it, runs 4 RL trials on `local/tiny` under a global concurrency limit of 2, halves
them after 2 cycles and runs the 2 kept to 3 cycles from their checkpoints.

Everything is read back from Prefect's records (the trials' flow runs, their creation and end
times, their cycle events, the artifact) and from the Whitney server; which trials a rung
keeps is recomputed here from the trials' own cycle events.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from .conftest import BLOCK_NAME, Stack
from .harness import wait_for
from .test_deployments import assert_nothing_open, finished_run, journal, whitney_runs
from .test_resume import events_named

SWEEP: dict[str, Any] = {
    "kind": "rl",
    "base": {"seed": 7, "prompts_per_cycle": 3, "group_size": 4, "max_tokens": 8},
    "grid": {"learning_rate": [0.002, 0.05], "lora_rank": [4, 8]},
    "rungs": [2, 3],
    "keep": 0.5,
    "max_concurrent": 2,
    "concurrency_limit": "e2e-sweep",
    "metric": "reward_mean",
    "mode": "max",
    "prices": {"trained_per_million": 1000.0},
}
SWEEP_TIMEOUT_S = 300
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "evaluation.md"
TRIAL_NAME = re.compile(r"-trial-(?P<trial>\d+)-rung-(?P<rung>\d+)$")

pytestmark = pytest.mark.timeout(540)


def completed_sweep(stack: Stack, config: dict[str, Any], name: str) -> dict[str, Any]:
    """The flow run of the sweep-on-demand deployment triggered with `config`, once completed."""
    deployment = stack.api.deployment("sweep", "sweep-on-demand")
    sweep = stack.api.create_flow_run_from_deployment(
        deployment["id"], {"config": config, "whitney_block": BLOCK_NAME}, name
    )
    return stack.api.wait_flow_run(
        sweep["id"], ["COMPLETED"], SWEEP_TIMEOUT_S, evidence=stack.evidence
    )


def trial_runs(stack: Stack, sweep_id: str) -> dict[tuple[int, int], dict[str, Any]]:
    """The sweep's trial flow runs by (trial, rung), found by the sweep's tag."""
    runs = stack.api.post(
        "/flow_runs/filter",
        json={"flow_runs": {"tags": {"all_": [f"whitney.sweep:{sweep_id}"]}}, "limit": 200},
    )
    found = {}
    for run in runs:
        match = TRIAL_NAME.search(run["name"])
        assert match is not None, run["name"]
        found[int(match["trial"]), int(match["rung"])] = run
    return found


def most_at_once(runs: list[dict[str, Any]]) -> int:
    """The most trial flow runs in flight at one instant, from their creation to their end: a
    trial creates its flow run once it holds a slot of the limit and gives the slot back after
    the run ended. (Not from their start times: two tiny trials started side by side can run
    one after the other, each process's start taking longer than the other's training.)"""
    edges = sorted(
        [(datetime.fromisoformat(run["created"]), 1) for run in runs]
        + [(datetime.fromisoformat(run["end_time"]), -1) for run in runs],
        key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same instant
    )
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def last_metric(stack: Stack, flow_run_id: str, cycles: int) -> float:
    """The trial's reward_mean in its last cycle, from its `whitney.cycle.completed` events."""

    def read() -> dict[int, float] | None:
        events = stack.api.events([f"prefect.flow-run.{flow_run_id}"])
        rows = {
            event["payload"]["cycle"]: event["payload"]["metrics"]["reward_mean"]
            for event in events
            if event["event"] == "whitney.cycle.completed"
        }
        return rows if len(rows) == cycles else None

    rows = wait_for(f"the cycle events of {flow_run_id}", read, 30)
    return rows[max(rows)]


def trained_tokens(stack: Stack, flow_run_id: str) -> int:
    """The tokens every Whitney run of the flow run trained, from the server's journal."""
    return sum(
        int(operation.usage.get("trained_tokens", 0))
        for run in whitney_runs(stack, flow_run_id)
        for operation in journal(stack, run.run_id)
    )


def documented_payload(event: str) -> set[str]:
    """The payload keys docs/evaluation.md's events table lists for `event`."""
    (row,) = [line for line in GUIDE.read_text().splitlines() if line.startswith(f"| `{event}`")]
    return set(re.findall(r"`(\w+)`", row.split("|")[4]))


def test_a_sweep_of_four_trials_runs_two_at_a_time_and_halves(alive: Stack) -> None:
    done = completed_sweep(alive, SWEEP, "e2e: sweep")

    trials = trial_runs(alive, done["id"])
    assert sorted(t for t, rung in trials if rung == 0) == list(range(4))
    assert len(trials) == 4 + 2 and {rung for _, rung in trials} == {0, 1}
    assert all(run["state_type"] == "COMPLETED" for run in trials.values())
    # never more than 2 trials in flight at once, and 2 at some point
    assert most_at_once(list(trials.values())) == 2

    # rung 0 keeps the best half by the last reward_mean (ties to the lower trial number)
    scores = {t: last_metric(alive, trials[t, 0]["id"], 2) for t in range(4)}
    ranked = sorted(scores, key=lambda t: (-scores[t], t))
    kept = sorted(ranked[: math.ceil(0.5 * 4)])
    assert sorted(t for t, rung in trials if rung == 1) == kept

    # a kept trial continues from its rung-0 final checkpoint, on cycle 2
    for trial in kept:
        first = finished_run(alive, trials[trial, 0]["id"])
        config = trials[trial, 1]["parameters"]["config"]
        assert config["resume_from"] == f"whitney://runs/{first.run_id}/states/cycle-1"
        assert (
            config["cycles"] == 3 and config["lora_rank"] == SWEEP["grid"]["lora_rank"][trial % 2]
        )
        finished_run(alive, trials[trial, 1]["id"])
    final = {t: last_metric(alive, trials[t, 1]["id"], 1) for t in kept}
    best = sorted(final, key=lambda t: (-final[t], t))[0]

    # nothing stays open: every session closed, every run terminal, every flow run over,
    # and no slot of the concurrency limit held
    for run in trials.values():
        assert_nothing_open(alive, run["id"])
    children = alive.api.child_flow_runs(done["id"])
    assert {run["id"] for run in children} == {run["id"] for run in trials.values()}
    limit = alive.api.get("/v2/concurrency_limits/e2e-sweep")
    assert (limit["limit"], limit["active_slots"]) == (2, 0)

    # the comparison lists all 4, how each ended, and the picture
    (artifact,) = [a for a in alive.api.artifacts([done["id"]]) if a["type"] == "markdown"]
    assert artifact["key"] == f"sweep-{done['id']}"
    rows = [line for line in artifact["data"].splitlines() if re.match(r"^\| \d+ \|", line)]
    assert [int(row.split("|")[1]) for row in rows] == list(range(4))
    status = {int(row.split("|")[1]): row.split("|")[-4].strip() for row in rows}
    # each trial's cost: the tokens its runs trained, at $1,000 a million
    for row in rows:
        trial = int(row.split("|")[1])
        tokens = sum(
            trained_tokens(alive, run["id"]) for (t, _), run in trials.items() if t == trial
        )
        assert tokens > 0 and row.split("|")[-3].strip() == f"${tokens / 1000:,.4f}"
    assert {t for t, s in status.items() if s == "stopped at rung 0"} == set(range(4)) - set(kept)
    assert status[best] == "best"
    assert "data:image/png;base64," in artifact["data"]

    # the best trial and its checkpoint, as an event of the sweep (stored on Prefect's clock)
    (event,) = events_named(alive, done["id"], "whitney.sweep.best")
    best_run = finished_run(alive, trials[best, 1]["id"])
    assert event["payload"]["trial"] == best
    assert set(event["payload"]) == documented_payload("whitney.sweep.best")
    assert event["payload"]["params"] == {
        "learning_rate": [0.002, 0.05][best // 2],
        "lora_rank": [4, 8][best % 2],
    }
    assert event["payload"]["checkpoint"] == f"whitney://runs/{best_run.run_id}/states/cycle-2"

    # retried from the UI, the sweep starts none of its finished trials again
    alive.api.set_flow_run_state(
        done["id"], {"type": "SCHEDULED", "name": "AwaitingRetry"}, force=True
    )
    again = alive.api.wait_flow_run(
        done["id"], ["COMPLETED"], SWEEP_TIMEOUT_S, evidence=alive.evidence
    )
    assert again["run_count"] == 2
    assert trial_runs(alive, done["id"]).keys() == trials.keys()


def sampled_tokens(stack: Stack, flow_run_id: str) -> int:
    """The tokens every Whitney run of the flow run sampled, from the server's journal."""
    return sum(
        int(operation.usage.get("sampled_tokens", 0))
        for run in whitney_runs(stack, flow_run_id)
        for operation in journal(stack, run.run_id)
    )


def test_a_rung_that_spent_the_budget_leaves_no_slot_to_a_waiting_trial(alive: Stack) -> None:
    """Three trials, one slot, a max_cost below any one rung's cost. Each trial's own token
    budget stops it after its first cycle, one short of its rung (the sweep reads back the one
    cycle its final checkpoint names, and waits for no other). The first rung starts (no
    projection yet); once it ends, its cost is settled before its slot is given back, so
    neither waiting trial starts, however soon it asks for the slot again (within about 2 s on the
    e2e stack: tests/e2e/conftest.py)."""
    config = {
        **SWEEP,
        "base": {**SWEEP["base"], "budget": {"max_tokens": 1}},
        "grid": {"learning_rate": [0.002, 0.01, 0.05]},
        "rungs": [2],
        "max_concurrent": 1,
        "concurrency_limit": "e2e-sweep-budget",
        "prices": {"sampled_per_million": 1000.0},  # every cycle samples >= 12 tokens
        "max_cost": 0.001,
    }
    done = completed_sweep(alive, config, "e2e: sweep budget")

    trials = trial_runs(alive, done["id"])
    assert len(trials) == 1, sorted(run["name"] for run in trials.values())
    ((ran, rung),) = trials
    assert rung == 0 and trials[ran, 0]["state_type"] == "COMPLETED"
    assert len(alive.api.child_flow_runs(done["id"])) == 1
    cost = sampled_tokens(alive, trials[ran, 0]["id"]) / 1000  # $1,000 a million
    assert cost > config["max_cost"]

    (artifact,) = [a for a in alive.api.artifacts([done["id"]]) if a["type"] == "markdown"]
    rows = [line for line in artifact["data"].splitlines() if re.match(r"^\| \d+ \|", line)]
    status = {int(row.split("|")[1]): row.split("|")[-4].strip() for row in rows}
    assert status == {t: "best" if t == ran else "skipped at rung 0 (max_cost)" for t in range(3)}
    assert f"Cost of the sweep: ${cost:,.4f}." in artifact["data"]
    limit = alive.api.get("/v2/concurrency_limits/e2e-sweep-budget")
    assert (limit["limit"], limit["active_slots"]) == (1, 0)
