"""Orchestration overhead: the RL flow against the page's plain loop, side by side in one run.

Both drive the same embedded Whitney server, started in its own process (`whitney-flows
serve`, as a remote Whitney would be, so Prefect's threads do not share its interpreter), with
the same cycle code (`flows.rl.flow.run_cycle`): the plain loop calls the client directly, one call
after another, with no Prefect; the flow runs every call as a Prefect task inside a
`cycle-{n}` subflow run and records artifacts. The flow runs three ways: unpipelined with
sequential sampling (exactly the plain loop's calls), unpipelined with a cycle's sample
requests fanned out on a reserved block of seq ids, and pipelined (the flow's default): fanned
out, and each cycle's forward_backward, optim_step and the save_weights_for_sampler publishing
the next cycle's sampler submitted back to back as task futures (`flows.rl.pipeline`). All four
train the same adapter: the script checks the sha256s agree.

A cycle's wall time is the interval between the starts of consecutive cycles, so it includes
everything a cycle costs: subflow creation and teardown, task runs, artifacts. Each run's
figure is the median over its cycles after the first; the repeats interleave the variants, and
the script prints the median over the repeats and the best repeat of each variant (on a
machine shared with other work, the least disturbed one).

First it measures what a sync subflow run costs with and without its heartbeat thread
(Prefect 3.9 joins it at teardown: about a second per subflow run; the flow turns it off for
its cycle subflows).

    python benchmarks/orchestration_overhead.py [--cycles 12] [--latency-ms 0 100] [--repeats 2]

Aim (issue 5): at --latency-ms 100 the pipelined flow takes <= 0.8x the plain loop's wall time
per cycle.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from served import quiet_prefect, served_whitney

from flows.core.connection import resolve_connection
from flows.core.heartbeat import subflows_without_heartbeat
from flows.core.sequenced_client import OperationLog, SequencedClient
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow, run_cycle
from flows.rl.metrics import CycleMetrics
from flows.rl.plan import check_rl_config
from tasks.connection import client_for
from whitney import wire

HEARTBEAT_S = 30


class PlainClient(SequencedClient):
    """The page's plain loop: every call straight to the Whitney client, no Prefect task."""

    def call(
        self, run_id: str, kind: str, payload: dict, seq_id: int, sampler_id: str | None
    ) -> wire.Operation:
        return client_for(self.connection).execute(
            run_id, kind, payload, seq_id=seq_id, sampler_id=sampler_id
        )


def plain_loop(config: RLConfig) -> tuple[list[CycleMetrics], str]:
    """The page's skeleton: session, run, the cycles, save_state, export_lora, finish, close;
    the cycles' metrics and the adapter's sha256."""
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
        cycles.append(run_cycle(plan, plain, cycle, run.run_id))
    plain.run_operation(run.run_id, "save_state", {})
    adapter = plain.run_operation(run.run_id, "export_lora", {})
    client.finish(run.run_id)
    client.close_session(session.session_id)
    return cycles, adapter["sha256"]


def rl_flow_cycles(config: RLConfig) -> tuple[list[CycleMetrics], str]:
    result = rl_flow(config)
    return result.cycles, result.adapter.sha256


def seconds_per_cycle(cycles: list[CycleMetrics]) -> float:
    """Median interval between consecutive cycle starts (the first cycle is a warm-up)."""
    starts = [metrics.started_at.timestamp() for metrics in cycles[1:]]
    return statistics.median(later - earlier for earlier, later in itertools.pairwise(starts))


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
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 100.0])
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
    }
    rows = []
    for latency_ms in args.latency_ms:
        with served_whitney(latency_ms) as url:
            config = RLConfig(api_url=url, base_model=args.base_model, cycles=args.cycles, seed=1)
            rl_flow(config.model_copy(update={"cycles": 2}))  # warm up Prefect and the server
            measured: dict[str, list[float]] = {name: [] for name in variants}
            adapters: set[str] = set()
            for _ in range(args.repeats):
                for name, (runner, updates) in variants.items():
                    cycles, sha256 = runner(config.model_copy(update=updates))
                    measured[name].append(seconds_per_cycle(cycles))
                    adapters.add(sha256)
            if len(adapters) != 1:
                raise SystemExit(f"the variants trained different adapters: {sorted(adapters)}")
            runs = {
                name: [round(value, 3) for value in values] for name, values in measured.items()
            }
            print(f"latency {latency_ms:g} ms: {runs} (one adapter: {adapters.pop()[:12]})")
            rows.append((latency_ms, measured))

    for title, statistic in (("median of the repeats", statistics.median), ("best repeat", min)):
        print()
        print(f"per-cycle wall time (median of cycles 2..{args.cycles}), {title} of {args.repeats}")
        header = ("latency", "plain loop", "flow", "ratio", "fan-out", "ratio", "pipelined")
        print("{:>8} {:>11} {:>9} {:>7} {:>9} {:>7} {:>10} {:>7}".format(*header, "ratio"))
        for latency_ms, measured in rows:
            row = {name: statistic(values) for name, values in measured.items()}
            plain = row["plain"]
            cells = [f"{latency_ms:>6g}ms", f"{plain:>10.3f}s"]
            for name, width in (("flow", 8), ("fan-out", 8), ("pipelined", 9)):
                cells += [f"{row[name]:>{width}.3f}s", f"{row[name] / plain:>6.2f}x"]
            print(" ".join(cells), flush=True)


if __name__ == "__main__":
    main()
