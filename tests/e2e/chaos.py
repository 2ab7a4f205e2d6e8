"""A seeded chaos soak on the e2e stack: training runs of rl-on-demand while the flow process,
the worker, the Prefect server and the Whitney server are SIGKILLed at random moments and
started again (the resume-run trigger on); then every run, followed through the runs that
continue it, must end with its reference sha256, every seq id executed once, and nothing left
open. Shared by tests/e2e/test_chaos.py (each part once) and benchmarks/chaos_soak.py.

The flow process killed is one the live worker started: the worker reports it Crashed
("exited with status code -9") and the automatic resume continues it. A killed worker's flow
runs crash at their next console line (their output pipe is broken: rich raises SystemExit),
report it themselves, and are resumed too; the worker's recovery counts until they are. Twice on
a PostgreSQL-backed server under load one of them reached neither Crashed nor Completed within
240 s of the kill (not diagnosed; presumably its broken pipe met first in a thread other than
the flow's, where rich's SystemExit ends only that thread, so it trains on): the soak now
waits up to 900 s for such a run to crash or complete.

Each continued run was decided by the resume-run trigger, by the resume sweep the soak starts
when no continuation came in time, or both: `recoveries` tells which, and whether its Crashed
or Failed state event reached the server's event store (where it did, the trigger must have
acted).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .conftest import PREFECT_SERVER, RESUME_SWEEP, WHITNEY_SERVER, WORKER, Stack
from .harness import HarnessError, pid_alive, wait_for
from .test_deployments import adapter_sha256, executions, finished_run, sessions_of, whitney_runs

FLOW = "flow-process"
PARTS = (FLOW, WORKER, PREFECT_SERVER, WHITNEY_SERVER)
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}
CONTINUING = {"RUNNING", "COMPLETED"}
"""The states of a run that continues a killed one: started, or already to its end."""
RECOVERY_TIMEOUT_S = 240.0
ORPHAN_TIMEOUT_S = 900.0
"""How long a killed worker's flow run may take to crash, or to complete if it trains on."""
TRIGGER_WAIT_S = 90.0
"""How long a kill waits for the resume trigger before it runs the resume sweep at once, as the
sweep's schedule (paused on the e2e stack) would later: a SQLite Prefect server under the
soak's load can lose the Crashed event the trigger needs."""
PARENT_TAG = "whitney.parent-flow-run:"
ENDED_EVENTS = ["prefect.flow-run.Crashed", "prefect.flow-run.Failed"]


def schedule(rng: random.Random, each: int) -> list[str]:
    """`each` kills of every part, in a seeded random order, but for the worker's last kill,
    which comes last: while the worker restarts, the runs it started train on and may finish,
    so a kill after it could find nothing training."""
    order = list(PARTS) * each
    rng.shuffle(order)
    order.append(order.pop(len(order) - 1 - order[::-1].index(WORKER)))
    return order


@dataclass
class Kill:
    """One kill: what, when (s since the soak started), and what its recovery took."""

    number: int
    part: str
    target: str
    at_s: float
    recovered_by: str = ""
    cost_s: float = 0.0


@dataclass
class Soak:
    """The soak's state: the runs started, the kills made, the processes seen."""

    stack: Stack
    start_run: Callable[[int], str]
    """Starts training run i (0, 1, 2, ...); its flow run id."""
    rng: random.Random
    recovery_timeout_s: float = RECOVERY_TIMEOUT_S
    """How long a kill's recovery may take (with the resume sweep on: its interval and
    settling time too)."""
    release: Callable[[], None] | None = None
    """Called once, by the last kill, as soon as its part is killed (and started again), before
    its recovery is waited for: lets runs held before their end (test_chaos.py holds each at
    its last cycle, so that they outlast the kills however fast the machine) go on to it."""
    started: float = field(default_factory=time.monotonic)
    roots: list[str] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    flow_pids: set[int] = field(default_factory=set)

    def say(self, line: str) -> None:
        print(f"[chaos {time.monotonic() - self.started:6.1f} s] {line}", flush=True)

    def chain(self, root: str) -> list[dict[str, Any]]:
        """The flow run and the runs that continue it, in order."""
        runs = [self.stack.api.flow_run(root)]
        while True:
            tag = PARENT_TAG + runs[-1]["id"]
            found = self.stack.api.post(
                "/flow_runs/filter", json={"flow_runs": {"tags": {"all_": [tag]}}, "limit": 10}
            )
            if not found:
                return runs
            assert len(found) == 1, f"{runs[-1]['id']} was continued twice: {found}"
            runs.append(found[0])

    def heads(self) -> list[dict[str, Any]]:
        return [self.chain(root)[-1] for root in self.roots]

    def training(self) -> bool:
        """Whether a training run has not ended for good (running, or about to be resumed)."""
        return any(
            (head.get("state_type") or "") not in ("COMPLETED", "FAILED", "CANCELLED")
            for head in self.heads()
        )

    def supervised(self) -> list[tuple[str, int]]:
        """The Running training runs whose process the live worker started: (id, pid)."""
        worker = self.stack.process(WORKER)
        worker.remember_descendants()
        found = []
        for head in self.heads():
            if head.get("state_type") != "RUNNING" or not head.get("infrastructure_pid"):
                continue
            pid = int(str(head["infrastructure_pid"]).rsplit(":", 1)[-1])
            if pid_alive(pid) and pid in worker.descendants:
                found.append((head["id"], pid))
        return sorted(found)

    def supervised_target(self) -> dict[str, Any] | None:
        """One of `supervised()`, chosen at random."""
        if not (eligible := self.supervised()):
            return None
        flow_run_id, pid = self.rng.choice(eligible)
        return {"id": flow_run_id, "pid": pid}

    def resumed(self, flow_run_id: str, timeout_s: float | None = None) -> str:
        """Wait (`timeout_s`, else the recovery timeout) until the flow run, killed, is Crashed
        and continued by a run that is Running or already Completed (a killed worker's orphans
        are waited for one after another: a later one's continuation may have finished by
        then), or, if it got to its end meanwhile, is Completed itself; what happened."""
        ended = self.stack.api.wait_flow_run(
            flow_run_id,
            ["CRASHED", "COMPLETED"],
            timeout_s or self.recovery_timeout_s,
            self.stack.evidence,
        )
        if ended["state_type"] == "COMPLETED":
            return f"{flow_run_id[:8]} completed"

        def continued() -> dict[str, Any] | None:
            found = self.stack.api.post(
                "/flow_runs/filter",
                json={"flow_runs": {"tags": {"all_": [PARENT_TAG + flow_run_id]}}},
            )
            return found[0] if found and found[0]["state_type"] in CONTINUING else None

        try:
            successor = wait_for(f"the run continuing {flow_run_id}", continued, TRIGGER_WAIT_S)
            by = ""
        except HarnessError:
            self.say(f"no run continues {flow_run_id[:8]} after {TRIGGER_WAIT_S:.0f} s: sweeping")
            sweep = self.stack.api.deployment(*RESUME_SWEEP)
            self.stack.api.create_flow_run_from_deployment(
                sweep["id"], {"settle_seconds": 0}, "chaos soak: a lost state event"
            )
            successor = wait_for(
                f"the run continuing {flow_run_id}",
                continued,
                self.recovery_timeout_s,
                evidence=self.stack.evidence,
            )
            by = " (a sweep started)"
        return f"{flow_run_id[:8]} resumed as {successor['id'][:8]}{by}"

    def kill(self, number: int, part: str, then: Callable[[], None] | None = None) -> Kill:
        """Kill `part`, start it again (or let the resume continue the flow run), call `then`,
        and wait until it is back."""
        if not self.training():
            raise HarnessError(f"every run ended before kill {number} ({part}): more cycles")
        began = time.monotonic()
        if part == FLOW:
            target = wait_for(
                "a running flow process the worker watches",
                self.supervised_target,
                self.recovery_timeout_s,
                evidence=self.stack.evidence,
            )
            kill = Kill(number, part, target["id"][:8], began - self.started)
            self.flow_pids.add(target["pid"])
            os.kill(target["pid"], signal.SIGKILL)
            if then is not None:
                then()
            kill.recovered_by = self.resumed(target["id"])
        else:
            kill = Kill(number, part, f"pid {self.stack.process(part).pid}", began - self.started)
            orphans = self.supervised() if part == WORKER else []
            self.stack.kill(part)
            self.stack.restart(part)
            if then is not None:
                then()
            kill.recovered_by = {
                PREFECT_SERVER: "restarted, API healthy",
                WHITNEY_SERVER: "restarted, answering",
                WORKER: "restarted, heartbeat",
            }[part]
            self.flow_pids |= {pid for _, pid in orphans}
            # an orphan may train on to its end, unseen in any log (see the module's docstring)
            outcomes = [self.resumed(flow_run_id, ORPHAN_TIMEOUT_S) for flow_run_id, _ in orphans]
            kill.recovered_by += "".join(f"; {outcome}" for outcome in outcomes)
        kill.cost_s = time.monotonic() - began
        self.kills.append(kill)
        self.say(f"kill {number}: {part} {kill.target}: {kill.recovered_by} in {kill.cost_s:.1f} s")
        return kill

    def run(self, runs: int, each: int, delay_s: tuple[float, float]) -> None:
        """Start `runs` runs, then kill each part `each` times, each kill a random
        `delay_s` after the previous recovery (the delay is the fault's timing, not a
        synchronisation: every wait is on a state)."""
        self.roots = [self.start_run(index) for index in range(runs)]
        for root in self.roots:  # started; one that already ended fails `kill`'s check
            self.stack.api.wait_flow_run(
                root, ["RUNNING", "COMPLETED"], self.recovery_timeout_s, self.stack.evidence
            )
        self.say(f"{runs} runs running: {', '.join(root[:8] for root in self.roots)}")
        order = schedule(self.rng, each)
        for number, part in enumerate(order, start=1):
            time.sleep(self.rng.uniform(*delay_s))
            self.kill(number, part, self.release if number == len(order) else None)

    def finish(self, timeout_s: float) -> list[list[dict[str, Any]]]:
        """Wait until every chain ends Completed; the chains."""

        def ended() -> list[list[dict[str, Any]]] | None:
            chains = [self.chain(root) for root in self.roots]
            done = all(chain[-1]["state_type"] == "COMPLETED" for chain in chains)
            return chains if done else None

        def heads() -> str:
            return "\n".join(
                f"{head['name']} ({head['id']}): {head['state_type']}: "
                f"{(head.get('state') or {}).get('message')}"
                for head in self.heads()
            )

        return wait_for(
            "every run to complete",
            ended,
            timeout_s,
            evidence=lambda: f"{heads()}\n{self.stack.evidence()}",
        )


def flow_runs_since(stack: Stack, since: str) -> list[dict[str, Any]]:
    """Every flow run (subflows too) expected to start after `since` (ISO time)."""
    return stack.api._every_page(
        "/flow_runs/filter", {"flow_runs": {"expected_start_time": {"after_": since}}}
    )


def open_flow_runs(stack: Stack, since: str) -> list[str]:
    """The flow runs since `since` not in a terminal state, as `name (id): STATE`; less the
    future runs the deployments' schedules create (`auto_scheduled`: the reaper's, the
    nightly SFT's)."""
    return [
        f"{run['name']} ({run['id']}): {run['state_type']}"
        for run in flow_runs_since(stack, since)
        if run["state_type"] not in TERMINAL and not run.get("auto_scheduled")
    ]


def live_flow_processes(stack: Stack, since: str, seen: set[int]) -> list[int]:
    """The processes of flow runs since `since` (as the worker recorded them) and `seen`
    that are still alive."""
    pids = set(seen)
    for run in flow_runs_since(stack, since):
        if run.get("infrastructure_pid"):
            pids.add(int(str(run["infrastructure_pid"]).rsplit(":", 1)[-1]))
    return sorted(pid for pid in pids if pid_alive(pid))


def check(soak: Soak, chains: list[list[dict[str, Any]]], references: list[str]) -> list[str]:
    """Every chain's adapter is its reference (in order), every seq id of every Whitney run
    ran once, every session closed; the per-run rows of the report."""
    rows = []
    for chain, reference in zip(chains, references, strict=True):
        run = finished_run(soak.stack, chain[-1]["id"])
        sha = adapter_sha256(soak.stack, run.run_id)
        assert sha == reference, (chain[-1]["id"], sha, reference)
        for flow_run in chain:
            for whitney_run in whitney_runs(soak.stack, flow_run["id"]):
                counts = executions(soak.stack, whitney_run.run_id)
                twice = {seq: n for seq, n in counts.items() if n != 1}
                assert not twice, f"{whitney_run.run_id}: seq ids executed {twice}"
                assert whitney_run.status != "running", whitney_run
            wait_for(
                f"the sessions of {flow_run['id']} to close",
                lambda flow_run_id=flow_run["id"]: all(
                    session.status == "closed" for session in sessions_of(soak.stack, flow_run_id)
                ),
                60,
            )
        rows.append(
            f"{chain[0]['id'][:8]}: {len(chain)} flow run(s) "
            f"({' -> '.join(r['state_type'] for r in chain)}), sha256 {sha[:12]} = reference"
        )
    return rows


@dataclass(frozen=True)
class Recovery:
    """Who decided to continue an ended flow run, and whether its state event was stored."""

    flow_run_id: str
    trigger: bool
    """A resume-run the trigger started (a top-level run of its deployment) decided."""
    sweep: bool
    """A resume-run subflow of a resume sweep decided."""
    delivered: bool
    """Its Crashed or Failed state event is in the server's event store."""


def recoveries(stack: Stack, chains: list[list[dict[str, Any]]], since: str) -> list[Recovery]:
    """How each continued flow run of the chains (all but their last) came to be continued,
    from the resume-runs completed since `since` (ISO time) and the server's events."""
    deciders = stack.api._every_page(
        "/flow_runs/filter",
        {
            "flows": {"name": {"any_": ["resume-run"]}},
            "flow_runs": {"expected_start_time": {"after_": since}},
        },
    )
    decided: dict[bool, set[str]] = {True: set(), False: set()}  # by a subflow (the sweep's)?
    for run in (run for run in deciders if run["state_type"] == "COMPLETED"):
        ended = str(run["parameters"]["flow_run_id"]).removeprefix("prefect.flow-run.")
        decided[run["parent_task_run_id"] is not None].add(ended)
    found = []
    for chain in chains:
        for ended in (run["id"] for run in chain[:-1]):
            query = {
                "resource": {"id": [f"prefect.flow-run.{ended}"]},
                "event": {"name": ENDED_EVENTS},
            }
            stored = stack.api.post("/events/filter", json={"filter": query, "limit": 1})
            found.append(
                Recovery(
                    ended, ended in decided[False], ended in decided[True], bool(stored["events"])
                )
            )
    return found


def settled(
    soak: Soak, chains: list[list[dict[str, Any]]], since: str, timeout_s: float
) -> list[Recovery]:
    """The soak's end: every flow run since `since` ended and every flow process it saw
    exited (each within `timeout_s`); then the `recoveries` of `chains`."""
    stack = soak.stack
    wait_for(
        "every flow run to end",
        lambda: open_flow_runs(stack, since) == [],
        timeout_s,
        evidence=lambda: "\n".join(open_flow_runs(stack, since)),
    )
    seen = soak.flow_pids | stack.orphans
    wait_for(
        "every flow process to exit",
        lambda: live_flow_processes(stack, since, seen) == [],
        timeout_s,
        evidence=lambda: str(live_flow_processes(stack, since, seen)),
    )
    return recoveries(stack, chains, since)


def recovery_rows(found: list[Recovery]) -> list[str]:
    """The paths counted, then one row per continued flow run."""
    counts = (
        f"{sum(r.trigger for r in found)} decided by the trigger, "
        f"{sum(r.sweep for r in found)} by the sweep, "
        f"{sum(not r.delivered for r in found)} state event(s) not stored, of {len(found)}"
    )
    return [counts] + [
        f"{r.flow_run_id[:8]}: trigger {r.trigger}, sweep {r.sweep}, event stored {r.delivered}"
        for r in found
    ]


def table(kills: list[Kill]) -> str:
    """The kills, their recoveries and what each cost, as a plain text table."""
    lines = [f"{'#':>2}  {'killed':<15} {'target':<12} {'at s':>7}  {'cost s':>7}  recovered"]
    for kill in kills:
        lines.append(
            f"{kill.number:>2}  {kill.part:<15} {kill.target:<12} {kill.at_s:>7.1f}  "
            f"{kill.cost_s:>7.1f}  {kill.recovered_by}"
        )
    return "\n".join(lines)
