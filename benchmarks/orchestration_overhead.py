"""Orchestration overhead: the RL flow against the plain loop of Whitney's Loop building blocks,
side by side in one run.

Both drive the same embedded Whitney server, started in its own process (`whitney-flows serve`, as a
remote Whitney would be, so Prefect's threads do not share its interpreter), with the same cycle
code (`flows.rl.cycle.run_cycle`): the plain loop calls the client directly, one call after another,
with no Prefect; the flow runs every call as a Prefect task inside a `cycle-{n}` subflow run and
records artifacts. The flow runs three ways: unpipelined with sequential sampling (exactly the plain
loop's calls), unpipelined with a cycle's sample requests fanned out on a reserved block of seq ids,
and pipelined (the flow's default): fanned out, and each cycle's forward_backward, optim_step and
the save_weights_for_sampler publishing the next cycle's sampler submitted back to back as task
futures (`CycleContext.run_tail`). All four train the same adapter: the script checks the
sha256s agree. The async variants are the pipelined flow with `max_staleness` 1 and 2
(flows.core.loop.off_policy_schedule): each cycle's training runs beside the sampling of the next
cycles,
on the server's two lanes; each trains an adapter of its own (other samples), the same on every
repeat (checked).

A cycle's wall time is the interval between the starts of consecutive cycles, so it includes
everything a cycle costs: subflow creation and teardown, task runs, artifacts. Each run's
figures are the median, the mean and the 95th percentile over its cycles after the first; the
repeats interleave the variants, and the script prints, for each variant, the median of each
figure over the repeats and the best repeat (the lowest median: on a machine shared with other
work, the least disturbed one), with the ratios to the plain loop by median and by mean.

First it measures what a sync subflow run costs with and without its heartbeat thread
(Prefect 3.9 joins it at teardown: about a second per subflow run; the flow turns it off for
its cycle subflows).

    python benchmarks/orchestration_overhead.py [--cycles 12] [--latency-ms 0 100 1000]

Aims (issue 12), the pipelined flow against the plain loop by mean wall time per cycle: at
most 1.5x at --latency-ms 0 and at most 0.7x at 100; its p95 per cycle at most 1.5x its median.
Aims (issue 15): async-1 at most 0.6x the plain loop at 100 ms, and faster than the pipelined
(on-policy) flow at 0 ms.
The Prefect server settings are the project's (flows/core/orchestration/prefect_env.py).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from served import quiet_prefect, served_whitney  # before prefect: it sets Prefect's settings

# isort: split
from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from blocks.connection import client_for
from blocks.endpoint import resolve_connection
from flows.core.loop.context import CycleContext
from flows.core.loop.cycles import CycleStart
from flows.core.orchestration.heartbeat import subflows_without_heartbeat
from flows.rl.config import RLConfig
from flows.rl.cycle import run_cycle
from flows.rl.flow import rl_flow
from flows.rl.metrics import CycleMetrics
from flows.rl.plan import check_rl_config
from tasks.operations import OperationLog, SequencedClient
from whitney import wire

HEARTBEAT_S = 30


class PlainClient(SequencedClient):
    """The plain loop: every call straight to the Whitney client, no Prefect task."""

    def call(
        self, run_id: str, kind: str, payload: dict, seq_id: int, sampler_id: str | None
    ) -> wire.Operation:
        return client_for(self.connection).execute(
            run_id, kind, payload, seq_id=seq_id, sampler_id=sampler_id
        )


def plain_loop(config: RLConfig) -> tuple[list[CycleMetrics], str]:
    """The Loop building blocks' skeleton: session, run, the cycles, save_state, export_lora,
    finish, close; the cycles' metrics and the adapter's sha256."""
    config = config.model_copy(update={"pipelined": False})  # one call after another
    plan = check_rl_config(config)
    connection = resolve_connection(config.api_url)
    client = client_for(connection)
    session = client.open_session({"benchmark": "plain-loop"})
    run = client.create_run(
        session.session_id,
        config.provider,
        config.base_model,
        lora_rank=config.lora_rank,
        seed=config.seed,
    )
    plain = PlainClient(connection, {run.run_id: run.next_seq_id}, config.task_retry)
    cycles = []
    for cycle in range(config.cycles):
        plain.log = OperationLog()
        start = CycleStart(first_cycle=0, seq_ids={run.run_id: plain.ledger.position(run.run_id)})
        cycles.append(run_cycle(plan, CycleContext(plain, run.run_id, cycle, start)))
    plain.run_operation(run.run_id, "save_state", {})
    adapter = plain.run_operation(run.run_id, "export_lora", {})
    client.finish(run.run_id)
    client.close_session(session.session_id)
    return cycles, adapter["sha256"]


def rl_flow_cycles(config: RLConfig) -> tuple[list[CycleMetrics], str]:
    result = rl_flow(config)
    return result.cycles, result.adapter.sha256


@dataclass(frozen=True)
class CycleTimes:
    """Seconds a cycle takes: the median, mean and 95th percentile of a run's cycles."""

    median: float
    mean: float
    p95: float


def cycle_times(cycles: list[CycleMetrics]) -> CycleTimes:
    """Of the intervals between consecutive cycle starts (the first cycle is a warm-up)."""
    starts = [metrics.started_at.timestamp() for metrics in cycles[1:]]
    intervals = [later - earlier for earlier, later in itertools.pairwise(starts)]
    return CycleTimes(statistics.median(intervals), statistics.fmean(intervals), p95(intervals))


def p95(values: list[float]) -> float:
    """The 95th percentile, interpolated between the values (the value itself if only one)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def median_of_repeats(repeats: list[CycleTimes]) -> CycleTimes:
    """Each figure's median over the repeats."""
    return CycleTimes(
        statistics.median(times.median for times in repeats),
        statistics.median(times.mean for times in repeats),
        statistics.median(times.p95 for times in repeats),
    )


def best_repeat(repeats: list[CycleTimes]) -> CycleTimes:
    """The repeat with the lowest median: the least disturbed one."""
    return min(repeats, key=lambda times: times.median)


@flow
def trivial_cycle(cycle: int) -> int:
    return cycle


@flow
def subflow_costs(count: int) -> tuple[float, float]:
    """Median wall time of a trivial sync subflow run, with and without its heartbeat."""
    with_heartbeat, without = [], []
    for cycle in range(count):
        started = time.perf_counter()
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: HEARTBEAT_S}):
            trivial_cycle(cycle)
        with_heartbeat.append(time.perf_counter() - started)
        started = time.perf_counter()
        with subflows_without_heartbeat():
            trivial_cycle(cycle)
        without.append(time.perf_counter() - started)
    return statistics.median(with_heartbeat), statistics.median(without)


def main() -> None:
    quiet_prefect()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 100.0, 1000.0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--base-model", default="local/tiny")
    args = parser.parse_args()

    heartbeat, no_heartbeat = subflow_costs(8)
    print(
        f"sync subflow run: {heartbeat:.3f} s with its heartbeat thread, "
        f"{no_heartbeat:.3f} s without (the flow's cycle subflows)",
        flush=True,
    )
    sequential = {"concurrent_sampling": False, "pipelined": False}
    variants: dict[str, tuple[Callable[[RLConfig], tuple[list[CycleMetrics], str]], Any]] = {
        "plain": (plain_loop, sequential),
        "flow": (rl_flow_cycles, sequential),
        "fan-out": (rl_flow_cycles, {"concurrent_sampling": True, "pipelined": False}),
        "pipelined": (rl_flow_cycles, {"concurrent_sampling": True, "pipelined": True}),
        "async-1": (rl_flow_cycles, {"max_staleness": 1}),
        "async-2": (rl_flow_cycles, {"max_staleness": 2}),
    }
    rows = []
    for latency_ms in args.latency_ms:
        with served_whitney(latency_ms) as url:
            config = RLConfig(api_url=url, base_model=args.base_model, cycles=args.cycles, seed=1)
            rl_flow(config.model_copy(update={"cycles": 2}))  # warm up Prefect and the server
            measured: dict[str, list[CycleTimes]] = {name: [] for name in variants}
            adapters: dict[int, set[str]] = {}  # by max_staleness: one adapter each
            for _ in range(args.repeats):
                for name, (runner, updates) in variants.items():
                    cycles, sha256 = runner(config.model_copy(update=updates))
                    measured[name].append(cycle_times(cycles))
                    adapters.setdefault(updates.get("max_staleness", 0), set()).add(sha256)
            if any(len(shas) != 1 for shas in adapters.values()):
                raise SystemExit(
                    f"variants of one staleness trained different adapters: {adapters}"
                )
            runs = {
                name: [round(times.median, 3) for times in repeats]
                for name, repeats in measured.items()
            }
            one_each = {staleness: shas.pop()[:12] for staleness, shas in adapters.items()}
            print(f"latency {latency_ms:g} ms: medians {runs} (adapter by staleness: {one_each})")
            rows.append((latency_ms, measured))

    for title, statistic in (
        ("median of the repeats", median_of_repeats),
        ("best repeat", best_repeat),
    ):
        print()
        print(f"per-cycle wall time (cycles 2..{args.cycles}), {title} of {args.repeats}")
        header = ("latency", "variant", "median", "mean", "p95", "ratio/median", "ratio/mean")
        print("{:>8} {:<10} {:>8} {:>8} {:>8} {:>13} {:>11}".format(*header))
        for latency_ms, measured in rows:
            row = {name: statistic(repeats) for name, repeats in measured.items()}
            plain = row["plain"]
            for name, times in row.items():
                cells = [f"{latency_ms:>6g}ms", f"{name:<10}"]
                cells += [f"{value:>7.3f}s" for value in (times.median, times.mean, times.p95)]
                if name != "plain":
                    cells += [f"{times.median / plain.median:>12.2f}x"]
                    cells += [f"{times.mean / plain.mean:>10.2f}x"]
                print(" ".join(cells), flush=True)


if __name__ == "__main__":
    main()
