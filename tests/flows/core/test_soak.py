"""Soak, short: two RL flows on one served Whitney while a driver SIGKILLs and restarts the
server twice at seeded random moments and, after the last, SIGKILLs the longest of the flows.
Every server kill hits at least one flow mid-run (alive, cycles left), the killed flow is
mid-run too. At the end every flow either finished with the adapter of an undisturbed run or
was killed; a lease after the end no session is open; no seq id ran twice; nothing the killed
flow started is left running (tests/flows/flowtest_soak.py). The long soak, more flows and
kills, is `python benchmarks/flow_soak.py`."""

from __future__ import annotations

from pathlib import Path

from flowtest_soak import soak

SEED = 20261202
CYCLES = 6
FLOWS = 2
SERVER_KILLS = 2


def test_flows_ride_through_random_server_kills_and_a_killed_flow_leaves_nothing(
    tmp_path: Path,
) -> None:
    figures = soak(tmp_path, seed=SEED, flows=FLOWS, server_kills=SERVER_KILLS, cycles=CYCLES)
    print(f"mid-run per kill {figures.hit}, restarts {figures.restart_s} s")
