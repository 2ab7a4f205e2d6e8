"""The Tinker route against the Whitney route: the same supervised steps and RL cycles on
`local/tiny`, through the official `tinker` SDK (protobuf, zstd, futures and all) and through
`whitney.WhitneyClient`, interleaved (Tinker, Whitney, Tinker, ...) against one served
process so both see the same machine. Every pair is checked bit for bit (the same losses,
logprobs, samples); prints each route's median wall time and the ratio (aim: Tinker <= 1.1x),
and the CPU time each route cost the server process and this (client) process, which a loaded
machine changes less than the wall time.

    python benchmarks/tinker_front.py [--repeats 5] [--sl-steps 8] [--rl-cycles 4]

With `--cookbook`, it then runs tinker-cookbook's supervised and RL loops on SmolLM2 (our
configs, tests/tinker/cookbook_configs.py) and prints their loss and reward per step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.local.served import served  # noqa: E402
from tests.tinker.steps import KEYS, assert_same, sdk_key, through_tinker, through_whitney  # noqa: E402


def server_cpu_s(pid: int) -> float:
    """The CPU seconds (user + system) process `pid` has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def fronts(url: str, pid: int, repeats: int, sl_steps: int, rl_cycles: int) -> None:
    """Each route's wall time, whole and after its setup (the client, session and run), and
    the server's and the client's CPU time."""
    whole: dict[str, list[float]] = {"tinker": [], "whitney": []}
    traces = {}
    training: dict[str, list[float]] = {"tinker": [], "whitney": []}
    cpu: dict[str, list[tuple[float, float]]] = {"tinker": [], "whitney": []}
    assert_same(through_tinker(url, sdk_key(0), 1, 1), through_whitney(url, KEYS[0], 1, 1))
    for _ in range(repeats):  # after one untimed pair: imports, the engine's first run
        for name, route, key in (
            ("tinker", through_tinker, sdk_key(0)),
            ("whitney", through_whitney, KEYS[0]),
        ):
            server, client, started = server_cpu_s(pid), client_cpu_s(), time.perf_counter()
            trace = route(url, key, sl_steps, rl_cycles)
            whole[name].append(time.perf_counter() - started)
            cpu[name].append((server_cpu_s(pid) - server, client_cpu_s() - client))
            training[name].append(whole[name][-1] - trace.setup_s)
            traces[name] = trace
        assert_same(traces["tinker"], traces["whitney"])
    print(f"{sl_steps} SL steps + {rl_cycles} RL cycles on local/tiny, {repeats} repeats")
    for label, times in (("whole route", whole), ("after setup", training)):
        tinker_s, whitney_s = (
            statistics.median(times["tinker"]),
            statistics.median(times["whitney"]),
        )
        print(f"  {label}: tinker SDK median {tinker_s:.3f} s ({fmt(times['tinker'])})")
        print(f"  {label}: WhitneyClient median {whitney_s:.3f} s ({fmt(times['whitney'])})")
        print(f"  {label}: ratio tinker / whitney {tinker_s / whitney_s:.3f} (aim <= 1.1)")
    for name, label in (("tinker", "tinker SDK"), ("whitney", "WhitneyClient")):
        server_s = statistics.median(c[0] for c in cpu[name])
        client_s = statistics.median(c[1] for c in cpu[name])
        print(f"  CPU: {label} median server {server_s:.3f} s, client {client_s:.3f} s")
    print("  every pair bit for bit the same")


def cookbook(url: str, sl_steps: int, rl_steps: int) -> None:
    import os

    from tinker_cookbook.rl import train as rl_train
    from tinker_cookbook.supervised import train as sl_train

    from tests.tinker.cookbook_configs import metrics, rl_config, sl_config, write_chats

    os.environ["TINKER_API_KEY"] = sdk_key(0)
    with tempfile.TemporaryDirectory(prefix="tinker-cookbook-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        config = sl_config(url, root / "sl", write_chats(root / "chats.jsonl"), sl_steps)
        asyncio.run(sl_train.main(config))
        nll = [round(m["train_mean_nll"], 3) for m in metrics(root / "sl") if "train_mean_nll" in m]
        print(f"cookbook supervised.train, {sl_steps} steps: {time.perf_counter() - started:.1f} s")
        print(f"  train_mean_nll per step: {nll}")
        started = time.perf_counter()
        asyncio.run(rl_train.main(rl_config(url, root / "rl", rl_steps)))
        key = "env/all/reward/total"
        rewards = [round(m[key], 3) for m in metrics(root / "rl") if key in m]
        print(f"cookbook rl.train, {rl_steps} steps: {time.perf_counter() - started:.1f} s")
        print(f"  reward per step: {rewards}")


def fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sl-steps", type=int, default=8)
    parser.add_argument("--rl-cycles", type=int, default=4)
    parser.add_argument("--cookbook", action="store_true")
    parser.add_argument("--cookbook-sl-steps", type=int, default=12)
    parser.add_argument("--cookbook-rl-steps", type=int, default=6)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="tinker-front-") as tmp,
        served(Path(tmp), keys=KEYS) as server,
    ):
        fronts(server.url, server.process.pid, args.repeats, args.sl_steps, args.rl_cycles)
        if args.cookbook:
            cookbook(server.url, args.cookbook_sl_steps, args.cookbook_rl_steps)


if __name__ == "__main__":
    main()
