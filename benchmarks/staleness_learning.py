"""Which losses learn off-policy: the RL flow on `digits` (the defaults: 30 cycles of 8 prompts
x 8 samples on local/tiny) for each loss at max_staleness 0, 1 and 2, ppo also with clipping
around the sampler's weights (proximal_clip false), on one embedded Whitney server. Prints, per
run, the mean reward of the first and last 5 cycles, the first cycle whose reward reaches 0.5
and 0.9, and the whole curve. The numbers are the engine's, the same on every run.

    python benchmarks/staleness_learning.py [--losses importance_sampling ppo cispo] [--cycles 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from served import quiet_prefect  # noqa: E402

from flows.rl.config import RLConfig  # noqa: E402
from flows.rl.flow import rl_flow  # noqa: E402
from whitney.local import EmbeddedWhitney  # noqa: E402


def first_reaching(rewards: list[float], level: float) -> str:
    return next((str(cycle) for cycle, reward in enumerate(rewards) if reward >= level), "-")


def main() -> None:
    quiet_prefect()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--losses", nargs="+", default=["importance_sampling", "ppo", "cispo"])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cycles", type=int, default=30)
    options = parser.parse_args()
    runs = [(loss, staleness, True) for loss in options.losses for staleness in options.staleness]
    if "ppo" in options.losses:
        runs += [("ppo", staleness, False) for staleness in options.staleness if staleness > 0]
    rows = []
    with EmbeddedWhitney() as server:
        os.environ["WHITNEY_API_KEY"] = server.api_key
        for loss, staleness, proximal in runs:
            config = RLConfig(
                api_url=server.url,
                cycles=options.cycles,
                loss=loss,
                max_staleness=staleness,
                proximal_clip=proximal,
            )
            rewards = [cycle.reward_mean for cycle in rl_flow(config).cycles]
            name = loss if proximal or staleness == 0 else f"{loss} (proximal_clip false)"
            row = (
                name,
                staleness,
                statistics.fmean(rewards[:5]),
                statistics.fmean(rewards[-5:]),
                first_reaching(rewards, 0.5),
                first_reaching(rewards, 0.9),
            )
            rows.append(row)
            print(
                f"{name}, max_staleness {staleness}: {[round(r, 2) for r in rewards]}", flush=True
            )
    print()
    print(f"{'loss':<32} {'staleness':>9} {'first 5':>8} {'last 5':>8} {'>=0.5':>6} {'>=0.9':>6}")
    for name, staleness, first, last, half, most in rows:
        print(f"{name:<32} {staleness:>9} {first:>8.3f} {last:>8.3f} {half:>6} {most:>6}")


if __name__ == "__main__":
    main()
