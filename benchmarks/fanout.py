"""Teacher fan-out: the distillation's teacher phase, fanned out versus one call after another.

The distillation flow scores a cycle's sampled sequences with the teacher run's `logprobs`, one
task per chunk of sequences. Fanned out (the default), the cycle reserves a block of the
teacher's seq ids and submits every chunk at once: the task runner runs the HTTP calls
concurrently, the server executes them in seq order, and the answers' latency overlaps.
Sequential, the same calls with the same seq ids go one after another. Both train the same
adapter: the script checks the sha256s agree.

The embedded server runs in its own process (`whitney-flows serve --latency-ms L`, as a remote
Whitney would), the flow runs with 8 prompts x 4 samples a cycle on `local/nano`, the teacher
being the base model (what the teacher knows does not change how long it takes), in chunks of
4 sequences: 8 logprobs tasks a cycle, plus the teacher's `save_weights_for_sampler`, submitted
with them. The figure is each cycle's `teacher_seconds` (the flow's wall time around the
teacher phase: task submission, the HTTP calls, the waits), median over the cycles after the
first and over the repeats, which interleave.

    python benchmarks/fanout.py [--latency-ms 0 50 200] [--cycles 6] [--repeats 2] [--dask]

Aim (issue 6): fanned out >= 5x faster than sequential at --latency-ms 200 with 8 chunks.
"""

from __future__ import annotations

import argparse
import statistics

from served import quiet_prefect, served_whitney

from flows.distill.config import DistillationConfig
from flows.distill.flow import distillation_flow


def teacher_phase(config: DistillationConfig) -> tuple[list[float], str]:
    """The cycles' teacher_seconds (after the first) and the student adapter's sha256."""
    result = distillation_flow(config)
    return [metrics.teacher_seconds for metrics in result.cycles[1:]], result.adapter.sha256


def main() -> None:
    quiet_prefect()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 50.0, 200.0])
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=4)
    parser.add_argument("--base-model", default="local/nano")
    parser.add_argument(
        "--dask", action="store_true", help="also fan out on prefect-dask's DaskTaskRunner"
    )
    args = parser.parse_args()

    variants = {
        "fanned-out": {"teacher_fan_out": True},
        "sequential": {"teacher_fan_out": False},
        "one-call": {"teacher_fan_out": False, "teacher_chunk_size": 0},
    }
    if args.dask:
        variants["dask"] = {"teacher_fan_out": True, "task_runner": "dask"}
    rows = []
    for latency_ms in args.latency_ms:
        with served_whitney(latency_ms) as url:
            config = DistillationConfig(
                api_url=url,
                base_model=args.base_model,
                cycles=args.cycles,
                seed=1,
                prompts="digits",  # no eval set: the flow is its cycles
                prompts_per_cycle=8,
                group_size=4,
                max_tokens=16,
                teacher_chunk_size=args.chunk_size,
                checkpoint_every=0,
            )
            distillation_flow(config.model_copy(update={"cycles": 2}))  # warm-up
            measured: dict[str, list[float]] = {name: [] for name in variants}
            adapters: set[str] = set()
            for _ in range(args.repeats):
                for name, updates in variants.items():
                    seconds, sha256 = teacher_phase(config.model_copy(update=updates))
                    measured[name] += seconds
                    adapters.add(sha256)
            if len(adapters) != 1:
                raise SystemExit(f"the variants trained different adapters: {sorted(adapters)}")
            row = {name: statistics.median(values) for name, values in measured.items()}
            print(
                f"latency {latency_ms:g} ms, {config.teacher_chunks} chunks: "
                + ", ".join(f"{name} {value:.3f} s" for name, value in row.items())
                + f" (one adapter: {adapters.pop()[:12]})",
                flush=True,
            )
            rows.append((latency_ms, config.teacher_chunks, row))

    print("\nteacher phase per cycle, as a ratio to fanned-out (higher: fan-out saves more)")
    for latency_ms, chunks, row in rows:
        fanned = row["fanned-out"]
        ratios = ", ".join(
            f"{name}/fanned-out {value / fanned:.2f}x"
            for name, value in row.items()
            if name != "fanned-out"
        )
        print(f"  latency {latency_ms:>5g} ms, {chunks} chunks: {ratios}")


if __name__ == "__main__":
    main()
