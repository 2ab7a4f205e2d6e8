"""The soak of tests/flows/core/test_soak.py, of any size: several RL flows on one served
Whitney while a driver SIGKILLs and restarts the server at seeded random moments and, after the
last, SIGKILLs the longest of the flows (the victim). Every server kill hits at least one flow
mid-run (alive, cycles left), the killed flow is mid-run too. At the end every flow either
finished with the adapter of an undisturbed run or was killed; a lease after the end no session
is open; no seq id ran twice; nothing the killed flow started is left running.
benchmarks/flow_soak.py runs it longer."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from flowtest_restart import (
    FlowProcess,
    assert_no_seq_id_ran_twice,
    kill_and_restart,
    process_parents,
    sigkill,
    start_flow,
    wait_for_cycles,
)

from tests.local.served import served

VICTIM_CYCLES = 400
LEASE_S = 6.0
CLOSED_WITHIN_S = LEASE_S + 5.0
"""A lease, then the server's reaper looks every lease / 4."""
GONE_WITHIN_S = 10.0
"""The CLI's watchdog looks every 0.2 s and gives SIGTERM 5 s before SIGKILL."""


@dataclass
class SoakFigures:
    """What a soak did: the flows each server kill found mid-run, the seconds each kill and
    restart took, the victim's cycles when it was killed."""

    hit: list[list[str]] = field(default_factory=list)
    restart_s: list[float] = field(default_factory=list)
    victim_cycles: int = 0


def mid_run(flows: list[FlowProcess], cycles: int) -> list[str]:
    """The flows training now: alive, with at least one of their `cycles` done and one left."""
    return [
        flow.name
        for flow in flows
        if flow.process.poll() is None and 0 < flow.cycles_done() < cycles
    ]


def soak(tmp_path: Path, *, seed: int, flows: int, server_kills: int, cycles: int) -> SoakFigures:
    """`flows` flows of `cycles` cycles (and the victim) through `server_kills` server kills
    at moments drawn from `seed`; asserts what the module says. Its figures."""
    schedule = random.Random(seed)
    config = ("--cycles", str(cycles), "--seed", "9", "--base-model", "local/nano")
    victim_config = ("--cycles", str(VICTIM_CYCLES), "--seed", "9", "--base-model", "local/nano")
    figures = SoakFigures()
    with served(tmp_path, "--session-ttl-s", f"{LEASE_S:g}") as server:
        # the victim starts (its own Prefect server, slow to start) beside the undisturbed run
        reference = start_flow(server, tmp_path, "reference", *config)
        victim = start_flow(server, tmp_path, "victim", *victim_config, own_prefect_server=True)
        assert reference.wait() == 0, reference.tail()
        wait_for_cycles(victim, 1)
        running = [start_flow(server, tmp_path, f"flow-{n}", *config) for n in range(flows)]
        for flow in running:
            wait_for_cycles(flow, 1)  # past the check that the server answers

        victim_dies_after = server_kills - 1  # so every server kill finds the victim training
        started_by_victim: set[int] = set()
        for kill in range(server_kills):
            time.sleep(schedule.uniform(0.5, 6.0))
            figures.hit.append(mid_run(running, cycles) + mid_run([victim], VICTIM_CYCLES))
            figures.restart_s.append(kill_and_restart(server))
            if kill == victim_dies_after:
                time.sleep(schedule.uniform(0.0, 2.0))
                started_by_victim = victim.descendants()
                assert mid_run([victim], VICTIM_CYCLES) == [victim.name], victim.tail()
                figures.victim_cycles = victim.cycles_done()
                sigkill(victim)
        assert all(figures.hit), f"a server kill found no flow mid-run (per kill: {figures.hit})"

        for flow in running:
            assert flow.wait() == 0, flow.tail()
            assert flow.adapter_sha256() == reference.adapter_sha256(), flow.name
        assert victim.process.returncode == -9
        assert started_by_victim, "the victim had started its Prefect server"

        deadline = time.monotonic() + CLOSED_WITHIN_S
        with server.client() as api:
            while open_ := [
                session
                for session in api.get("/v1/sessions").json()["sessions"]
                if session["status"] == "open"
            ]:
                assert time.monotonic() < deadline, open_
                time.sleep(0.2)
            closed = api.get("/v1/sessions").json()["sessions"]
        reasons = sorted(session["closed_reason"] for session in closed)
        assert reasons.count("closed by the client") == flows + 1
        assert [reason for reason in reasons if reason.startswith("lease expired")], reasons
        assert_no_seq_id_ran_twice(server)

    deadline = time.monotonic() + GONE_WITHIN_S
    while left := started_by_victim & set(process_parents()):
        assert time.monotonic() < deadline, f"still running after the victim died: {left}"
        time.sleep(0.2)
    return figures
