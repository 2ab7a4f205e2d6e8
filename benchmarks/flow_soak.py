"""The soak of tests/flows/core/test_soak.py, longer: `--flows` RL flows of `--cycles` cycles
(`local/nano`) on one served Whitney while the server is SIGKILLed and started again `--kills`
times at moments drawn from `--seed`, then the longest flow SIGKILLed; the same checks as the
test (tests/flows/flowtest_soak.py: every flow's adapter is the undisturbed run's, every session
closed, no seq id ran twice, nothing the killed flow started left running). Prints what each
kill found mid-run and how long each restart took. The test runs 2 flows and 2 kills; this
runs, by default, 3 flows of 10 cycles through 5 kills, on a Prefect test harness.

    python benchmarks/flow_soak.py [--seed 20261202] [--flows 3] [--kills 5] [--cycles 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests" / "flows")]

from flowtest_soak import soak  # noqa: E402
from prefect.testing.utilities import prefect_test_harness  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--flows", type=int, default=3)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=10)
    options = parser.parse_args()
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="flow-soak-") as workdir,
        prefect_test_harness(server_startup_timeout=180),
    ):
        figures = soak(
            Path(workdir),
            seed=options.seed,
            flows=options.flows,
            server_kills=options.kills,
            cycles=options.cycles,
        )
    for kill, (hit, restart_s) in enumerate(zip(figures.hit, figures.restart_s, strict=True)):
        print(f"kill {kill + 1}: mid-run {', '.join(hit)}; server back in {restart_s:.2f} s")
    print(f"victim killed after {figures.victim_cycles} cycles")
    print(f"all checks passed in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
