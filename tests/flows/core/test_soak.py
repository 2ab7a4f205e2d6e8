"""Soak: several RL flows on one served Whitney while a driver SIGKILLs and restarts the server
at seeded random moments and, after the last, SIGKILLs the longest of the flows. Every server
kill hits at least one flow mid-run (alive, cycles left), the killed flow is mid-run too. At
the end every flow either finished with the adapter of an undisturbed run or was killed; a
lease after the end no session is open; no seq id ran twice; nothing the killed flow started
is left running."""

from __future__ import annotations

import random
import time
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

SEED = 20261202
CYCLES, VICTIM_CYCLES = 6, 400
CONFIG = ("--cycles", str(CYCLES), "--seed", "9", "--base-model", "local/nano")
VICTIM = ("--cycles", str(VICTIM_CYCLES), "--seed", "9", "--base-model", "local/nano")
FLOWS = 3
SERVER_KILLS = 3
LEASE_S = 6.0
CLOSED_WITHIN_S = LEASE_S + 5.0
"""A lease, then the server's reaper looks every lease / 4."""
GONE_WITHIN_S = 10.0
"""The CLI's watchdog looks every 0.2 s and gives SIGTERM 5 s before SIGKILL."""


def mid_run(flows: list[FlowProcess], cycles: int) -> list[str]:
    """The flows training now: alive, with at least one of their `cycles` done and one left."""
    return [
        flow.name
        for flow in flows
        if flow.process.poll() is None and 0 < flow.cycles_done() < cycles
    ]


def test_flows_ride_through_random_server_kills_and_a_killed_flow_leaves_nothing(
    tmp_path: Path,
) -> None:
    schedule = random.Random(SEED)
    with served(tmp_path, "--session-ttl-s", f"{LEASE_S:g}") as server:
        reference = start_flow(server, tmp_path, "reference", *CONFIG)
        assert reference.wait() == 0, reference.tail()

        victim = start_flow(server, tmp_path, "victim", *VICTIM, own_prefect_server=True)
        wait_for_cycles(victim, 1)
        flows = [start_flow(server, tmp_path, f"flow-{n}", *CONFIG) for n in range(FLOWS)]
        for flow in flows:
            wait_for_cycles(flow, 1)  # past the check that the server answers

        victim_dies_after = SERVER_KILLS - 1  # so every server kill finds the victim training
        started_by_victim: set[int] = set()
        hit: list[list[str]] = []
        for kill in range(SERVER_KILLS):
            time.sleep(schedule.uniform(0.5, 6.0))
            hit.append(mid_run(flows, CYCLES) + mid_run([victim], VICTIM_CYCLES))
            kill_and_restart(server)
            if kill == victim_dies_after:
                time.sleep(schedule.uniform(0.0, 2.0))
                started_by_victim = victim.descendants()
                assert mid_run([victim], VICTIM_CYCLES) == [victim.name], victim.tail()
                sigkill(victim)
        assert all(hit), f"a server kill found no flow mid-run (per kill: {hit})"

        for flow in flows:
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
        assert reasons.count("closed by the client") == FLOWS + 1
        assert [reason for reason in reasons if reason.startswith("lease expired")], reasons
        assert_no_seq_id_ran_twice(server)

    deadline = time.monotonic() + GONE_WITHIN_S
    while left := started_by_victim & set(process_parents()):
        assert time.monotonic() < deadline, f"still running after the victim died: {left}"
        time.sleep(0.2)
