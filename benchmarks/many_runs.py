"""Many training runs at once on the stack of docs/prefect-server.md, its Prefect server on
SQLite, on PostgreSQL, and on PostgreSQL with its events through Redis (`postgresql+redis`),
side by side: `--runs` runs of rl-on-demand (`local/tiny`, `--cycles` cycles, seeds
seed..seed+`--seeds`-1 in turn) created at once as deployment runs, taken by `--workers`
workers, the resume trigger on (its sweep paused, as on the e2e stack); then the same with the
Prefect server SIGKILLed and started again once, when half the cycles are done.

For each database and each of the two cases it reports: each run (followed through the runs
that continue it) ending with the adapter sha256 of its seed's run alone (run first, one at a
time, once); every flow-run state the API holds delivered as its state event (counted); runs
per hour; the p50/p95 of a cycle's Prefect overhead (from one cycle's start to the next's,
less the cycle's own `wall_seconds`) and of the API's answers (a probe asks
`/flow_runs/filter` every 0.5 s); the errors the server logged; the slowest run's wall time
beside the median (fairness); how often the API refused to create a run (a client asks
again); how long the stack took to start. Progress lines go to stdout and to `--progress`.
Each seed's run alone is kept in test-artifacts/many-runs/references.json (by its config).

    python benchmarks/many_runs.py [--runs 16] [--cycles 10] [--workers 2] [--seeds 4]
        [--databases sqlite postgresql postgresql+redis] [--cases undisturbed server-killed]
        [--server-setting PREFECT_SERVER_DATABASE_SQLALCHEMY_POOL_SIZE=20 ...]

Logs and results.json in test-artifacts/many-runs/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.e2e.chaos import PARENT_TAG, TERMINAL, flow_runs_since, open_flow_runs  # noqa: E402
from tests.e2e.conftest import (  # noqa: E402
    PREFECT_SERVER,
    RESUME_TRIGGER,
    Stack,
    running_stack,
)
from tests.e2e.harness import ARTIFACTS_DIR, HarnessError  # noqa: E402
from tests.e2e.state_events import states_and_events  # noqa: E402
from tests.e2e.test_deployments import SMALL, adapter_sha256, finished_run  # noqa: E402
from tests.e2e.test_resume import start  # noqa: E402

OUT_DIR = ARTIFACTS_DIR / "many-runs"
SERVER_ERRORS = re.compile(r"\| ERROR|database is locked|Max flush retries|Traceback")
"""Lines of the Prefect server's log that are errors."""
SETTLE_S = 90.0
"""How long the count waits for state events still on their way to the event store (a
restarted server's persister claims what its predecessor held after 30 s)."""


class Progress:
    """Progress lines with the time since the start, to stdout and to a file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file: TextIO = path.open("a")
        self.began = time.monotonic()

    def say(self, line: str) -> None:
        text = f"[{time.monotonic() - self.began:7.1f} s] {line}"
        print(text, flush=True)
        self.file.write(text + "\n")
        self.file.flush()


class Probe(threading.Thread):
    """Times one `/flow_runs/filter` every 0.5 s: the API's answers as a user's UI gets them."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(daemon=True)
        self.stack = stack
        self.seconds: list[float] = []
        self.failures: Counter[str] = Counter()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            began = time.monotonic()
            try:
                response = self.stack.api.http.post(
                    "/flow_runs/filter", json={"limit": 5}, timeout=30
                )
            except Exception as error:  # noqa: BLE001 - a server down is a datum
                self.failures[type(error).__name__] += 1
                continue
            if response.status_code >= 400:
                self.failures[str(response.status_code)] += 1
            else:
                self.seconds.append(time.monotonic() - began)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def config(seed: int, cycles: int) -> dict[str, Any]:
    return {**SMALL, "seed": seed, "cycles": cycles, "checkpoint_every": 2}


def create(stack: Stack, run_config: dict[str, Any], message: str, refusals: Counter[str]) -> str:
    """Create a deployment run as a client would, asking again for 5 minutes while the API
    refuses (the harness already asks 5 times a second apart); the refusals counted."""
    deadline = time.monotonic() + 300
    while True:
        try:
            return start(stack, run_config, {}, message)
        except HarnessError as error:
            refusals[str(error).split(": ", 1)[0].rsplit(" ", 1)[-1]] += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def chain(stack: Stack, root: str) -> list[dict[str, Any]]:
    """The flow run and the runs that continue it, in order."""
    runs = [stack.api.flow_run(root)]
    while True:
        tag = PARENT_TAG + runs[-1]["id"]
        found = stack.api.post(
            "/flow_runs/filter", json={"flow_runs": {"tags": {"all_": [tag]}}, "limit": 10}
        )
        if not found:
            return runs
        runs.append(found[0])


def cycles_done(stack: Stack, since: str) -> int:
    return stack.api.post(
        "/flow_runs/count",
        json={
            "flows": {"name": {"any_": ["rl-cycle"]}},
            "flow_runs": {
                "state": {"type": {"any_": ["COMPLETED"]}},
                "expected_start_time": {"after_": since},
            },
        },
    )


def cycle_overheads(stack: Stack, flow_runs: list[dict[str, Any]]) -> list[float]:
    """Per cycle: the time from its start to the next cycle's start in the same flow run, less
    its own wall_seconds (from its artifact)."""
    overheads = []
    for run in flow_runs:
        if run.get("parent_task_run_id"):
            continue
        cycles = [c for c in stack.api.child_flow_runs(run["id"]) if c["state_type"] == "COMPLETED"]
        walls = {}
        for artifact in stack.api.artifacts([c["id"] for c in cycles]):
            found = re.search(r"\| wall_seconds \| ([0-9.]+) \|", artifact.get("data") or "")
            if found:
                walls[artifact["flow_run_id"]] = float(found.group(1))
        for this, after in zip(cycles, cycles[1:], strict=False):
            if this["id"] in walls and this["start_time"] and after["start_time"]:
                gap = datetime.fromisoformat(after["start_time"]) - datetime.fromisoformat(
                    this["start_time"]
                )
                overheads.append(gap.total_seconds() - walls[this["id"]])
    return overheads


def server_errors(stack: Stack) -> Counter[str]:
    text = stack.process(PREFECT_SERVER).log_text()
    return Counter(match.group(0) for match in SERVER_ERRORS.finditer(text))


def scenario(
    stack: Stack, args: argparse.Namespace, references: dict[int, str], kill: bool, say: Any
) -> dict[str, Any]:
    """Start the runs at once, SIGKILL the Prefect server half-way if `kill`, wait, measure."""
    since = datetime.now(UTC).isoformat()
    seeds = [args.seed + index % args.seeds for index in range(args.runs)]
    probe = Probe(stack)
    probe.start()
    began = time.monotonic()
    refusals: Counter[str] = Counter()
    roots = [
        create(stack, config(seed, args.cycles), f"many runs: run {index}", refusals)
        for index, seed in enumerate(seeds)
    ]
    say(f"{len(roots)} runs created in {time.monotonic() - began:.1f} s, refusals {refusals}")
    total = args.runs * args.cycles
    killed_at = None
    last_line = 0.0
    deadline = began + args.timeout
    heads: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            heads = [chain(stack, root)[-1] for root in roots]
            done = cycles_done(stack, since)
        except HarnessError as error:
            say(f"API: {str(error)[:120]}")
            time.sleep(2)
            continue
        states = Counter(head["state_type"] for head in heads)
        if time.monotonic() - last_line > 10:
            say(f"cycles {done}/{total}, runs {dict(sorted(states.items()))}")
            last_line = time.monotonic()
        if kill and killed_at is None and done >= total // 2:
            killed_at = time.monotonic() - began
            say(f"SIGKILL the Prefect server at {done}/{total} cycles")
            stack.kill(PREFECT_SERVER)
            say(f"Prefect server up again after {stack.restart(PREFECT_SERVER):.1f} s")
        ended = all(head["state_type"] in ("COMPLETED", "FAILED", "CANCELLED") for head in heads)
        if ended and not open_flow_runs(stack, since):  # no resume under way
            break
        time.sleep(2)
    wall_s = time.monotonic() - began
    probe.stopping.set()
    probe.join()
    say(f"every run ended (or the timeout) after {wall_s:.1f} s")

    chains = [chain(stack, root) for root in roots]
    matched, run_walls = 0, []
    for seed, runs in zip(seeds, chains, strict=True):
        last = runs[-1]
        if last["state_type"] != "COMPLETED":
            continue
        matched += adapter_sha256(stack, finished_run(stack, last["id"]).run_id) == references[seed]
        first = datetime.fromisoformat(runs[0]["start_time"] or runs[0]["expected_start_time"])
        run_walls.append((datetime.fromisoformat(last["end_time"]) - first).total_seconds())
    flow_runs = flow_runs_since(stack, since)
    ours = [run for run in flow_runs if not run.get("auto_scheduled")]
    counted = states_and_events(stack.api, ours, since)
    settle = time.monotonic() + SETTLE_S
    while counted["missing"] and time.monotonic() < settle:
        time.sleep(5)
        counted = states_and_events(stack.api, ours, since)
    overheads = cycle_overheads(stack, [run for runs in chains for run in runs])
    completed = sum(runs[-1]["state_type"] == "COMPLETED" for runs in chains)
    return {
        "runs": args.runs,
        "creation_refusals": dict(refusals),
        "completed": completed,
        "sha256_equal_alone": matched,
        "continued_runs": sum(len(runs) - 1 for runs in chains),
        "open_flow_runs": sum(run["state_type"] not in TERMINAL for run in ours),
        "flow_run_states": counted["states"],
        "state_events_stored": counted["events"],
        "state_events_missing": counted["missing"],
        "wall_s": round(wall_s, 1),
        "runs_per_hour": round(completed / wall_s * 3600, 1),
        "cycle_overhead_p50_s": round(percentile(overheads, 0.5), 3),
        "cycle_overhead_p95_s": round(percentile(overheads, 0.95), 3),
        "api_p50_s": round(percentile(probe.seconds, 0.5), 3),
        "api_p95_s": round(percentile(probe.seconds, 0.95), 3),
        "api_failures": dict(probe.failures),
        "server_errors": dict(server_errors(stack)),
        "run_wall_median_s": round(statistics.median(run_walls), 1) if run_walls else None,
        "run_wall_max_s": round(max(run_walls), 1) if run_walls else None,
        "server_killed_at_s": round(killed_at, 1) if killed_at is not None else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--seeds", type=int, default=4, help="distinct configs, in turn")
    parser.add_argument(
        "--databases",
        nargs="+",
        default=["sqlite", "postgresql", "postgresql+redis"],
        help="sqlite, postgresql; +redis: the server's events through Redis",
    )
    parser.add_argument("--cases", nargs="+", default=["undisturbed", "server-killed"])
    parser.add_argument("--timeout", type=float, default=3600.0, help="per case, s")
    parser.add_argument(
        "--server-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Prefect server setting on top of the project's (repeatable)",
    )
    parser.add_argument("--progress", type=Path, default=OUT_DIR / "progress.log")
    args = parser.parse_args()
    logging.getLogger("whitney.client").setLevel(logging.ERROR)
    progress = Progress(args.progress)
    say = progress.say
    say(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs; {vars(args)}")
    cache = OUT_DIR / "references.json"
    cached = json.loads(cache.read_text()) if cache.exists() else {}
    references: dict[int, str] = {}
    for seed in range(args.seed, args.seed + args.seeds):
        if key := cached.get(json.dumps(config(seed, args.cycles), sort_keys=True)):
            references[seed] = key
    results: dict[str, dict[str, Any]] = {}
    for case in args.cases:
        for database in args.databases:
            name = f"{database}/{case}"
            say(f"{name}: starting the stack ({args.workers} workers)")
            stack_began = time.monotonic()
            with (
                tempfile.TemporaryDirectory() as root,
                running_stack(
                    Path(root),
                    OUT_DIR / f"logs-{database}-{case}",
                    database=database.removesuffix("+redis"),
                    workers=args.workers,
                    redis=database.endswith("+redis"),
                    server_settings=dict(item.split("=", 1) for item in args.server_setting),
                ) as stack,
            ):
                stack_start_s = time.monotonic() - stack_began
                stack.enable_automation(RESUME_TRIGGER, True)
                for seed in range(args.seed, args.seed + args.seeds):
                    if seed not in references:  # its run alone
                        flow_run_id = start(stack, config(seed, args.cycles), {}, "alone")
                        stack.api.wait_flow_run(flow_run_id, ["COMPLETED"], 1800, stack.evidence)
                        run_id = finished_run(stack, flow_run_id).run_id
                        references[seed] = adapter_sha256(stack, run_id)
                        cached[json.dumps(config(seed, args.cycles), sort_keys=True)] = references[
                            seed
                        ]
                        cache.write_text(json.dumps(cached, indent=2))
                        say(f"seed {seed} alone: {references[seed][:12]}")
                try:
                    results[name] = scenario(stack, args, references, case == "server-killed", say)
                except HarnessError as error:
                    results[name] = {"error": str(error)[:2000]}
                results[name]["stack_start_s"] = round(stack_start_s, 1)
                say(f"{name}: {json.dumps(results[name])}")
    say(f"load average after: {os.getloadavg()}")
    (OUT_DIR / "results.json").write_text(json.dumps(results, indent=2))
    keys = sorted({key for result in results.values() for key in result})
    print(f"\n{'':28}" + "".join(f"{name:>28}" for name in results))
    for key in keys:
        print(f"{key:28}" + "".join(f"{str(r.get(key, '')):>28}" for r in results.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
