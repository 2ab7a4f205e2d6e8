"""The chaos soak, longer: the stack of docs/prefect-server.md (Prefect server, embedded Whitney,
process worker, the deployments, the resume-run trigger and its sweep on), `--runs` RL runs of
rl-on-demand (`local/tiny`, seeds seed..seed+runs-1) while the flow process, the worker, the Prefect
server and the Whitney server are SIGKILLed `--each` times each, in a seeded random order, at
seeded random moments, and started again. Prints the kills and what each recovery cost, then
checks every run against an undisturbed run of its seed (run first, one at a time): the same
adapter sha256, each seq id executed once, every Whitney session closed, no flow run left
open, no flow process left alive; then the recoveries by path: for each continued flow run,
whether the resume-run trigger or the resume sweep decided, and whether its Crashed or Failed
state event was stored. tests/e2e/test_chaos.py is the short one.

    python benchmarks/chaos_soak.py [--seed 29] [--runs 3] [--each 2] [--cycles 30]

About 4 minutes on 2 cores with the defaults. Logs in test-artifacts/chaos-soak-logs/.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.e2e.chaos import Soak, check, recovery_rows, settled, table  # noqa: E402
from tests.e2e.conftest import RESUME_SWEEP, RESUME_TRIGGER, running_stack  # noqa: E402
from tests.e2e.harness import ARTIFACTS_DIR  # noqa: E402
from tests.e2e.test_deployments import SMALL, adapter_sha256, finished_run  # noqa: E402
from tests.e2e.test_resume import start  # noqa: E402

SWEPT_RECOVERY_S = 720.0
"""A kill's recovery may take the resume sweep's interval (300 s) and settling (120 s) on top
of the trigger's, for a state event the Prefect server lost."""


def config(seed: int, cycles: int, checkpoint_every: int) -> dict[str, Any]:
    return {**SMALL, "seed": seed, "cycles": cycles, "checkpoint_every": checkpoint_every}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--each", type=int, default=2, help="kills of every part")
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--delay", type=float, nargs=2, default=(1.0, 8.0), metavar=("MIN", "MAX"))
    args = parser.parse_args()
    logging.getLogger("whitney.client").setLevel(logging.ERROR)  # the restarts' retries
    configs = [config(args.seed + i, args.cycles, args.checkpoint_every) for i in range(args.runs)]
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs", flush=True)
    print("starting the stack (Prefect server, Whitney, worker, deployments)", flush=True)
    with (
        tempfile.TemporaryDirectory() as root,
        running_stack(Path(root), ARTIFACTS_DIR / "chaos-soak-logs") as stack,
    ):
        stack.enable_automation(RESUME_TRIGGER, True)
        stack.pause_deployment(*RESUME_SWEEP, paused=False)  # the backstop, as installed
        began = time.monotonic()
        shas = []
        for index, each in enumerate(configs):  # one at a time: the least load on the server
            flow_run_id = start(stack, each, {}, "chaos soak: undisturbed")
            stack.api.wait_flow_run(flow_run_id, ["COMPLETED"], 1800, stack.evidence)
            shas.append(adapter_sha256(stack, finished_run(stack, flow_run_id).run_id))
            print(f"undisturbed run {index}: {shas[-1][:12]}", flush=True)
        undisturbed_s = time.monotonic() - began
        print(f"undisturbed: {args.runs} runs one after the other in {undisturbed_s:.1f} s")

        since = datetime.now(UTC).isoformat()
        soak = Soak(
            stack,
            lambda index: start(stack, configs[index], {}, f"chaos soak: run {index}"),
            random.Random(args.seed),
            recovery_timeout_s=SWEPT_RECOVERY_S,
        )
        soak.run(runs=args.runs, each=args.each, delay_s=tuple(args.delay))
        chains = soak.finish(timeout_s=3600)
        disturbed_s = time.monotonic() - soak.started
        rows = check(soak, chains, shas)
        paths = recovery_rows(settled(soak, chains, since, 120))  # every resume-run ended
    print(f"\nchaos soak, seed {args.seed}: {len(soak.kills)} kills")
    print(table(soak.kills))
    print("\n".join(rows))
    print("\nrecoveries by path")
    print("\n".join(paths))
    print(
        f"wall time: {disturbed_s:.1f} s under chaos ({args.runs} runs side by side) against "
        f"{undisturbed_s:.1f} s undisturbed (one after the other); every run ended with its "
        f"undisturbed sha256, each seq id executed once, nothing left open"
    )
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
