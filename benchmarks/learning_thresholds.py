"""The learning runs the tests keep only a smoke of, to their thresholds, with the checks the
tests took before they were cut to a smoke. Each check prints its curve and PASS or FAIL;
the exit status is 1 if any failed.

- quiz: `whitney-flows run rl --env quiz --cycles 10`: mean reward of the first 5 cycles at
  most 0.3, of the last 5 at least 0.2 above it (tests/flows/cli/test_quiz_cli.py, 4 cycles);
- sft: `whitney-flows run sft` with its defaults (60 steps): the last eval loss at most half
  the first (tests/flows/cli/test_sft_cli.py, 10 steps);
- rl-loop: `python examples/rl_loop.py --cycles 10`: mean reward of the first 3 cycles below
  0.15, of the last 3 above 0.5 (tests/examples/test_examples.py, 5 cycles);
- async: the RL flow on `digits`, 18 cycles, importance_sampling 1 step off-policy and ppo 2
  steps off-policy: mean reward of the first 5 cycles below 0.1, of the last 5 above 0.6
  (tests/flows/rl/test_async_rl.py, 10 cycles); benchmarks/staleness_learning.py has every
  loss and staleness at 30 cycles, without checks;
- distill: the distillation of tests/flows/distill/test_distill.py at 5 cycles: the teacher
  KL of the last cycle below 0.6 of the first's, the student's eval after the run closer to
  the teacher's by a fifth of the way at least (the test, 3 cycles).

The CLI checks run the console script on the embedded server and Prefect it starts, as a user
runs it, in a temporary directory.

    python benchmarks/learning_thresholds.py [quiz] [sft] [rl-loop] [async] [distill]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "benchmarks"), str(REPO_ROOT / "tests" / "flows")]

from served import quiet_prefect  # noqa: E402

CONSOLE_SCRIPT = Path(sys.executable).with_name("whitney-flows")
CYCLE = re.compile(r"^cycle (\d+)/(\d+)  reward ([\d.]+)")


def console(workdir: Path, *arguments: str) -> list[dict]:
    """`whitney-flows run ARGUMENTS --metrics-out` in `workdir` (no WHITNEY_API_*: the CLI
    starts its embedded server); its metrics lines."""
    metrics = workdir / "metrics.jsonl"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WHITNEY_API_")}
    environment["XDG_DATA_HOME"] = str(workdir / "data")
    argv = [str(CONSOLE_SCRIPT), "run", *arguments, "--metrics-out", str(metrics)]
    subprocess.run(argv, cwd=workdir, env=environment, check=True, capture_output=True)
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def quiz(workdir: Path) -> bool:
    rewards = [
        line["reward_mean"] for line in console(workdir, "rl", "--env", "quiz", "--cycles", "10")
    ]
    first, last = statistics.fmean(rewards[:5]), statistics.fmean(rewards[-5:])
    print(f"quiz rewards {[round(r, 3) for r in rewards]}; first 5 {first:.3f}, last 5 {last:.3f}")
    return len(rewards) == 10 and first <= 0.3 and last >= first + 0.2


def sft(workdir: Path) -> bool:
    lines = console(workdir, "sft")
    evals = [point for line in lines for point in line["evals"]]
    print(f"sft eval losses {[(point['step'], round(point['loss'], 3)) for point in evals]}")
    return evals[0]["step"] == 0 and evals[-1]["loss"] <= 0.5 * evals[0]["loss"]


def rl_loop(workdir: Path) -> bool:
    argv = [sys.executable, str(REPO_ROOT / "examples" / "rl_loop.py"), "--cycles", "10"]
    argv += ["--out", str(workdir / "adapters")]
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "HOME": str(workdir)}
    completed = subprocess.run(
        argv, cwd=workdir, env=environment, capture_output=True, text=True, check=True
    )
    rewards = [float(m[3]) for line in completed.stdout.splitlines() if (m := CYCLE.match(line))]
    print(f"rl_loop rewards {rewards}")
    return (
        len(rewards) == 10
        and statistics.mean(rewards[:3]) < 0.15
        and statistics.mean(rewards[-3:]) > 0.5
    )


def off_policy(workdir: Path) -> bool:
    from flows.rl.config import RLConfig
    from flows.rl.flow import rl_flow
    from whitney.local import EmbeddedWhitney

    passed = True
    with EmbeddedWhitney(data_dir=workdir / "whitney") as server:
        os.environ["WHITNEY_API_KEY"] = server.api_key
        for loss, staleness in (("importance_sampling", 1), ("ppo", 2)):
            config = RLConfig(api_url=server.url, cycles=18, max_staleness=staleness, loss=loss)
            rewards = [cycle.reward_mean for cycle in rl_flow(config).cycles]
            first, last = statistics.fmean(rewards[:5]), statistics.fmean(rewards[-5:])
            print(f"{loss}, max_staleness {staleness}: {[round(r, 3) for r in rewards]}")
            passed &= first < 0.1 and last > 0.6
    return passed


def distill(workdir: Path) -> bool:
    from flowtest_distill import make_teacher_checkpoint
    from flowtest_settings import QUICK_RECOVERY

    from flows.distill.config import DistillationConfig
    from flows.distill.flow import distillation_flow
    from whitney.client import WhitneyClient
    from whitney.local import EmbeddedWhitney

    with (
        EmbeddedWhitney(data_dir=workdir / "whitney", latency_ms=200) as server,
        WhitneyClient(server.url, server.api_key) as client,
    ):
        os.environ["WHITNEY_API_KEY"] = server.api_key
        config = DistillationConfig(
            api_url=server.url,
            base_model="local/nano",
            cycles=5,
            seed=5,
            teacher_checkpoint=make_teacher_checkpoint(client, "local/nano"),
            prompts_per_cycle=8,
            group_size=4,
            max_tokens=24,
            teacher_chunk_size=4,
            checkpoint_every=0,
            **QUICK_RECOVERY,
        )
        result = distillation_flow(config)
    kl = [metrics.teacher_kl for metrics in result.cycles]
    print(f"distill teacher KL {[round(value, 4) for value in kl]}; eval {result.eval}")
    if result.eval is None:
        return False
    before, after, teacher = (
        result.eval.student_before,
        result.eval.student_after,
        result.eval.teacher,
    )
    return kl[-1] < 0.6 * kl[0] and teacher < before and after - teacher < 0.8 * (before - teacher)


CHECKS: dict[str, Callable[[Path], bool]] = {
    "quiz": quiz,
    "sft": sft,
    "rl-loop": rl_loop,
    "async": off_policy,
    "distill": distill,
}


def main() -> None:
    quiet_prefect()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checks", nargs="*", help=f"of {', '.join(CHECKS)} (default: all)")
    options = parser.parse_args()
    if unknown := set(options.checks) - CHECKS.keys():
        parser.error(f"no such check: {', '.join(sorted(unknown))}")
    failed = []
    for name in options.checks or list(CHECKS):
        with tempfile.TemporaryDirectory(prefix=f"learning-{name}-") as workdir:
            passed = CHECKS[name](Path(workdir))
        print(f"{name}: {'PASS' if passed else 'FAIL'}", flush=True)
        if not passed:
            failed.append(name)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
