"""Does a real pretrained model learn on the embedded server? The RL flow of
examples/smollm2-arithmetic.toml (SmolLM2-135M-Instruct, dequantised from the Q4_1 GGUF that
`whitney-flows models pull smollm2-135m-instruct` imports, on one-digit sums) on one embedded
Whitney server, with eval_at_start: the flow evaluates the base model (the fresh run's zero
adapter) before the first cycle exactly as it evaluates later cycles. Prints the reward curve
(each cycle's wall seconds beside the seconds it waited on the server's operations: the first
cycle's include the base evaluation's, which its wall time leaves out), each
evaluation, the held-out greedy accuracy before and after (the final one, and the best
one beside it), the minutes, the CPU and the load the machine was under.

    python benchmarks/real_model_learning.py [--config FILE] [--cycles N] [--eval-every N]
        [--learning-rate X] [--group-size G] [--prompts-per-cycle P] [--max-tokens T]
        [--picture FILE.png]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from served import quiet_prefect  # noqa: E402

from flows.core.config import settings_with_overrides, validated  # noqa: E402
from flows.core.evaluation.plan import EvalMetrics  # noqa: E402
from flows.core.records.plots import Line, Panel, render_png  # noqa: E402
from flows.rl.config import RLConfig  # noqa: E402
from flows.rl.flow import rl_flow  # noqa: E402
from flows.rl.metrics import CycleMetrics  # noqa: E402
from whitney import hf_cache  # noqa: E402
from whitney.local import EmbeddedWhitney  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
OVERRIDES = ("cycles", "eval_every", "learning_rate", "group_size", "prompts_per_cycle")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's processor."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def pulled(model: str) -> Path | None:
    """The snapshot of a hub model in the cache (None for a `local/*` model); exits in one
    line naming the pull command when a hub model is missing."""
    if model.startswith("local/"):
        return None
    snapshot = hf_cache.snapshot(model)
    if snapshot is None:
        sys.exit(
            f"{model} is not in {hf_cache.cache_dir()}: "
            "run `whitney-flows models pull smollm2-135m-instruct` first"
        )
    return snapshot


def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return f"{cpu_model()}, {cores} cores usable, load average {load}"


def follow(path: Path, stop: threading.Event, line: Callable[[dict], str]) -> None:
    """Print `line(cycle)` for each metrics line the flow appends: the progress of a long run,
    also when the output goes to a file."""
    done = 0
    while not stop.wait(2.0):
        lines = path.read_text().splitlines() if path.exists() else []
        for text in lines[done:]:
            print(line(json.loads(text)), flush=True)
        done = len(lines)


def followed(run: Callable[[], T], metrics: Path, line: Callable[[dict], str]) -> tuple[T, float]:
    """`run()` while `follow` prints its metrics lines; its result and wall seconds."""
    started = time.perf_counter()
    stop = threading.Event()
    progress = threading.Thread(target=follow, args=(metrics, stop, line), daemon=True)
    progress.start()
    try:
        result = run()
    finally:
        stop.set()
        progress.join()
    return result, time.perf_counter() - started


@contextmanager
def data_flow_settings(base_model: str, rows: list[dict]) -> Iterator[tuple[dict[str, Any], Path]]:
    """For a flow trained on a data file (SFT, DPO): `rows` as a JSONL file in a scratch
    directory and an embedded server (on the Hugging Face cache when `base_model` is pulled),
    its key in WHITNEY_API_KEY; yields the config settings they give (server, model, renderer,
    data, metrics file, no checkpoints) and the metrics file."""
    real = pulled(base_model) is not None
    with (
        tempfile.TemporaryDirectory(prefix="whitney-bench-") as scratch,
        EmbeddedWhitney(hf_cache=hf_cache.cache_dir() if real else None) as server,
    ):
        data, metrics = Path(scratch) / "data.jsonl", Path(scratch) / "metrics.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.environ["WHITNEY_API_KEY"] = server.api_key
        settings = {
            "api_url": server.url,
            "base_model": base_model,
            "renderer": "chat_template" if real else "auto",
            "data_path": str(data),
            "checkpoint_every": 0,
            "metrics_path": str(metrics),
        }
        yield settings, metrics


def cycle_line(cycle: dict) -> str:
    """An RL cycle's reward (and evaluation) as one progress line."""
    before, evaluation = cycle.get("eval_before"), cycle.get("eval")
    first = f"before training: held-out greedy {before['reward_mean']:.3f}\n" if before else ""
    extra = f", held-out greedy {evaluation['reward_mean']:.3f}" if evaluation else ""
    operations = sum(cycle["op_seconds"].values())
    return (
        f"{first}cycle {cycle['cycle']}: reward {cycle['reward_mean']:.3f}, "
        f"{cycle['wall_seconds']:.1f} s ({operations:.1f} s waiting on operations){extra}"
    )


def operation_totals(cycles: list[CycleMetrics]) -> str:
    """The seconds the cycles waited on each kind of operation, summed, the largest first."""
    totals: dict[str, float] = {}
    for cycle in cycles:
        for kind, seconds in cycle.op_seconds.items():
            totals[kind] = totals.get(kind, 0.0) + seconds
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    return ", ".join(f"{kind} {seconds:.1f} s" for kind, seconds in ranked)


def describe(metrics: EvalMetrics) -> str:
    return (
        f"greedy accuracy {metrics.reward_mean:.3f}, sampled {metrics.sampled_reward_mean:.3f}, "
        f"pass@{metrics.k} {metrics.pass_at_k:.3f} on {metrics.prompts} held-out problems"
    )


def picture(curve: list[tuple[int, EvalMetrics]], rewards: list[float]) -> bytes:
    """The held-out accuracy by cycles trained (0: the base model) beside the training reward."""
    lines = [
        Line(label, [(cycle + 1, getattr(metrics, name)) for cycle, metrics in curve])
        for label, name in (("greedy", "reward_mean"), ("sampled", "sampled_reward_mean"))
    ]
    reward = Line("reward_mean", [(cycle + 1, value) for cycle, value in enumerate(rewards)])
    return render_png(
        [
            Panel("held-out accuracy", "cycles trained", lines),
            Panel("training reward", "cycles trained", [reward]),
        ]
    )


def main() -> None:
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")  # busy CPU
    quiet_prefect()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", type=Path, default=ROOT / "examples" / "smollm2-arithmetic.toml"
    )
    parser.add_argument("--cycles", type=int)
    parser.add_argument("--eval-every", type=int)
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--group-size", type=int)
    parser.add_argument("--prompts-per-cycle", type=int)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--picture", type=Path, help="write the learning curves here (PNG)")
    options = parser.parse_args()
    overrides = {name: getattr(options, name) for name in (*OVERRIDES, "max_tokens")}
    settings = settings_with_overrides(options.config, overrides)
    config = validated(RLConfig, {**settings, "eval_at_start": True})
    pulled(config.base_model)
    print(f"machine: {machine()}", flush=True)
    print(
        f"config: {options.config.name}, {config.cycles} cycles of {config.prompts_per_cycle} "
        f"prompts x {config.group_size} samples x {config.max_tokens} tokens, "
        f"lr {config.learning_rate:g}, eval every {config.eval_every}",
        flush=True,
    )
    with EmbeddedWhitney(hf_cache=hf_cache.cache_dir()) as server:
        os.environ["WHITNEY_API_KEY"] = server.api_key
        config = config.model_copy(update={"api_url": server.url})
        with tempfile.TemporaryDirectory(prefix="whitney-bench-") as scratch:
            metrics = Path(scratch) / "metrics.jsonl"
            traced = config.model_copy(update={"metrics_path": str(metrics)})
            result, seconds = followed(lambda: rl_flow(traced), metrics, cycle_line)
        minutes = seconds / 60
    print(f"machine at the end: {machine()}")
    print("reward per cycle: " + " ".join(f"{c.reward_mean:.2f}" for c in result.cycles))
    print("waiting on operations, by kind: " + operation_totals(result.cycles))
    before = result.cycles[0].eval_before
    assert before is not None, "eval_at_start evaluates the base model in the first cycle"
    curve = [(-1, before)] + [(c.cycle, c.eval) for c in result.cycles if c.eval is not None]
    for cycle, metrics in curve:
        label = "base model" if cycle < 0 else f"after cycle {cycle}"
        print(f"  {label:>16}: {describe(metrics)}")
    if options.picture:
        options.picture.write_bytes(picture(curve, [c.reward_mean for c in result.cycles]))
        print(f"learning curves: {options.picture}")
    after = curve[-1][1]
    best_cycle, best = max(curve[1:], key=lambda point: point[1].reward_mean)
    print(
        f"held-out greedy accuracy {before.reward_mean:.3f} -> {after.reward_mean:.3f} final "
        f"({after.reward_mean - before.reward_mean:+.3f}; best {best.reward_mean:.3f}, after "
        f"cycle {best_cycle}) in {minutes:.1f} minutes ({seconds:.1f} s: "
        f"base evaluation, {len(result.cycles)} cycles and their evaluations), "
        f"{config.base_model}, on {cpu_model()}"
    )


if __name__ == "__main__":
    main()
