"""Evaluation, forks, resume and sweeps on the chain: an RL run with inline evaluation through a
broker that forwards provider `tinker` runs to the embedded Tinker front (official SDK), and the
same run emulated on the CPU engine (the front itself): the same eval figures and adapter
sha256; `evaluate-checkpoint` of a forwarded checkpoint, a `whitney-flows fork` and a
`resume_from` of the forwarded run, and a 2-trial, 1-rung sweep: the same numbers and adapters
as their emulated twins (`local/tiny`, 2 cycles). A forwarded checkpoint given to a run of the
CPU engine is refused in one line naming the field. Every `whitney-flows` process here reaches
the package's one Prefect server (`prefect_api`)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness import ManagedProcess
from tests.local.served import ServedWhitney, served
from tests.tinker.steps import KEYS, sdk_key
from tests.tinker.test_provider_flows import environment
from tests.tinker.test_tinker_provider import tinker_key
from whitney import WhitneyClient
from whitney.errors import InvalidRequest

ROOT = Path(__file__).resolve().parents[2]
PARENT = ["--cycles", "2", "--set", "eval_every=1", "--set", "checkpoint_every=1"]
NOT_TIMED = {"seconds"}
EVALUATE = """
import json, sys
from flows.checkpoints.config import EvaluateConfig
from flows.checkpoints.evaluate import evaluate_checkpoint
from flows.rl.config import RLConfig
config = EvaluateConfig(api_url=sys.argv[2], evaluation=RLConfig().eval_settings())
result = evaluate_checkpoint(sys.argv[1], config)
numbers = result.evaluation.model_dump(exclude={"seconds"})
print(json.dumps({"cycle": result.cycle, "run_id": result.run_id,
                  "frozen": result.frozen_run_id, "evaluation": numbers}))
"""


@dataclass(frozen=True)
class Ran:
    """A finished `whitney-flows` command: its run, adapter sha256, metrics lines, manifest."""

    run_id: str
    sha256: str
    metrics: list[dict]
    manifest: Path


def cli(argv: list[str], api_url: str, tmp: Path, out: str, prefect_api: str) -> Ran:
    """`whitney-flows ARGV` against `api_url` (Prefect's API at `prefect_api`); its adapter and
    metrics under tmp/out."""
    metrics = tmp / f"{out}.jsonl"
    argv = [sys.executable, "-m", "flows.cli.main", *argv, "--api-url", api_url]
    argv += ["--adapter-dir", str(tmp / out), "--metrics-out", str(metrics)]
    env = environment(tmp, prefect_api)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (manifest,) = (tmp / out).glob("*-manifest.json")
    (adapter,) = (tmp / out).glob("*-adapter.tar")
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    run_id = json.loads(manifest.read_text())["run_id"]
    return Ran(run_id, hashlib.sha256(adapter.read_bytes()).hexdigest(), lines, manifest)


def evaluations(ran: Ran) -> list[dict]:
    """The inline evaluation of each cycle, without its wall time."""
    return [
        {k: v for k, v in line["eval"].items() if k not in NOT_TIMED}
        for line in ran.metrics
        if line.get("eval")
    ]


def evaluated(checkpoint: str, api_url: str, tmp: Path, prefect_api: str) -> dict:
    """The evaluate-checkpoint flow's result for `checkpoint` (RL's default eval settings)."""
    argv = [sys.executable, "-c", EVALUATE, checkpoint, api_url]
    env = environment(tmp, prefect_api)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Twins:
    """The broker (forwarding) and the front (emulating), with a parent RL run on each, and the
    Prefect API their flows report to."""

    broker: ServedWhitney
    front: ServedWhitney
    chain: Ran
    cpu: Ran
    tmp: Path
    prefect_api: str

    def forwarded(self, run_id: str) -> bool:
        """The broker's run `run_id` trained at the front (through the SDK), not on its CPU."""
        with WhitneyClient(self.broker.url, KEYS[0]) as client:
            return client.get_run(run_id).model_extra["trained_at"] == self.front.url


@pytest.fixture(scope="module")
def twins(
    server: ServedWhitney, prefect_api: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Twins]:
    tmp = tmp_path_factory.mktemp("chain-flows")
    (tmp / "broker").mkdir()
    argv = ["run", "rl", "--provider", "tinker", *PARENT]
    with (
        tinker_key(sdk_key(0)),
        served(tmp / "broker", "--tinker-url", server.url, keys=KEYS) as broker,
    ):
        chain = cli(argv, broker.url, tmp / "chain", "parent", prefect_api)
        cpu = cli(argv, server.url, tmp / "cpu", "parent", prefect_api)
        yield Twins(broker, server, chain, cpu, tmp, prefect_api)


def test_inline_evaluation_on_the_chain_gives_the_cpu_engines_figures(twins: Twins) -> None:
    assert [line["cycle"] for line in twins.chain.metrics if line.get("eval")] == [0, 1]
    assert evaluations(twins.chain) == evaluations(twins.cpu)
    assert twins.chain.sha256 == twins.cpu.sha256
    assert twins.forwarded(twins.chain.run_id)


def test_evaluate_checkpoint_of_a_forwarded_run(twins: Twins) -> None:
    chain = evaluated(
        f"whitney://runs/{twins.chain.run_id}/states/cycle-0",
        twins.broker.url,
        twins.tmp / "chain",
        twins.prefect_api,
    )
    cpu = evaluated(
        f"whitney://runs/{twins.cpu.run_id}/states/cycle-0",
        twins.front.url,
        twins.tmp / "cpu",
        twins.prefect_api,
    )
    assert (chain["cycle"], chain["run_id"]) == (0, twins.chain.run_id)
    assert chain["evaluation"] == cpu["evaluation"] == evaluations(twins.chain)[0]
    assert twins.forwarded(chain["frozen"])  # the frozen run sampled at the front


def test_a_fork_of_a_forwarded_run_gives_its_emulated_twins_adapter(twins: Twins) -> None:
    argv = ["fork", "--cycle", "0", "--set", "learning_rate=0.004"]
    chain = cli(
        [*argv[:1], str(twins.chain.manifest), *argv[1:]],
        twins.broker.url,
        twins.tmp / "chain",
        "fork",
        twins.prefect_api,
    )
    cpu = cli(
        [*argv[:1], str(twins.cpu.manifest), *argv[1:]],
        twins.front.url,
        twins.tmp / "cpu",
        "fork",
        twins.prefect_api,
    )
    assert [line["cycle"] for line in chain.metrics if "loss" in line] == [1]
    assert chain.sha256 == cpu.sha256 != twins.chain.sha256
    assert twins.forwarded(chain.run_id)


def test_a_resume_of_a_forwarded_run_is_its_parent(twins: Twins) -> None:
    def resumed(parent: Ran, api_url: str, tmp: Path) -> Ran:
        checkpoint = f"resume_from=whitney://runs/{parent.run_id}/states/cycle-0"
        argv = ["run", "rl", "--provider", "tinker", *PARENT, "--set", checkpoint]
        return cli(argv, api_url, tmp, "resume", twins.prefect_api)

    chain = resumed(twins.chain, twins.broker.url, twins.tmp / "chain")
    cpu = resumed(twins.cpu, twins.front.url, twins.tmp / "cpu")
    assert chain.sha256 == cpu.sha256 == twins.chain.sha256
    assert twins.forwarded(chain.run_id)
    assert evaluations(chain) == evaluations(twins.chain)[1:]


POOL = "chain-sweep"
DEPLOY = """
import sys
from prefect import flow
trials = flow.from_source(sys.argv[1], "flows/rl/flow.py:rl_flow")
trials.deploy("chain-sweep", work_pool_name="chain-sweep", build=False, push=False)
"""
SWEEP = """
import json, sys
from flows.sweep.config import SweepConfig
from flows.sweep.flow import sweep_flow
config = SweepConfig.model_validate_json(sys.argv[1])
result = sweep_flow(config)
print(json.dumps([rung.model_dump(include={"trial", "state", "score", "run_id"})
                  for trial in result.trials for rung in trial.rungs]))
"""


@contextmanager
def trials_of(prefect_api: str, tmp: Path) -> Iterator[dict[str, str]]:
    """On the Prefect server at `prefect_api`: the deployment `rl/chain-sweep` of the RL flow on
    a process work pool, and a worker of that pool (each flow run a process of its own): the
    environment that reaches them."""
    env = environment(tmp, prefect_api)
    prefect = [sys.executable, "-m", "prefect"]
    for argv in (
        [*prefect, "work-pool", "create", POOL, "--type", "process"],
        [sys.executable, "-c", DEPLOY, str(ROOT)],
    ):
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=300, check=False, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
    worker = [*prefect, "worker", "start", "--pool", POOL, "--prefetch-seconds", "5"]
    # it looks for scheduled flow runs each second (Prefect's 10 s: up to 10 s idle a trial)
    process = ManagedProcess("worker", worker, env | {"PREFECT_WORKER_QUERY_SECONDS": "1"}, tmp)
    try:
        yield env
    finally:
        process.stop()


def swept(api_url: str, env: dict[str, str], name: str) -> list[dict]:
    """Each trial's rung of a 2-trial, 1-rung RL sweep of provider `tinker` runs at `api_url`."""
    config = {
        "kind": "rl",
        "deployment": "rl/chain-sweep",
        "base": {"api_url": api_url, "provider": "tinker"},
        "grid": {"learning_rate": [0.002, 0.004]},
        "rungs": [2],
        "max_concurrent": 1,
        "concurrency_limit": f"chain-{name}",
    }
    argv = [sys.executable, "-c", SWEEP, json.dumps(config)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def exported_sha256(api_url: str, run_id: str, scratch: Path) -> str:
    """The sha256 of the archive of the run's last `export_lora` (its flow's normal end),
    downloaded and hashed here."""
    with WhitneyClient(api_url, KEYS[0]) as client:
        (export,) = [op for op in client.iter_journal(run_id) if op.kind == "export_lora"]
        archive = client.download_artifact(export.result["artifact_id"], scratch / f"{run_id}.tar")
    return hashlib.sha256(archive.read_bytes()).hexdigest()


def test_a_resume_of_a_forwarded_run_on_the_cpu_engine_is_refused_in_one_line(
    twins: Twins,
) -> None:
    """Its state is on the Tinker endpoint: a provider `local` run cannot load it. This run's
    Prefect is its own ephemeral one, as a new user's: on the parent's Prefect server the flow
    would refuse it sooner, from the parent's config (provider cannot change in a fork)."""
    checkpoint = f"whitney://runs/{twins.chain.run_id}/states/cycle-0"
    argv = [sys.executable, "-m", "flows.cli.main", "run", "rl", *PARENT]
    argv += ["--set", f"resume_from={checkpoint}", "--api-url", twins.broker.url]
    env = environment(twins.tmp / "local", None)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("whitney-flows run rl: the flow run ended Failed"), last
    assert (
        f"from_checkpoint: checkpoint '{checkpoint}' was saved by a run forwarded to Tinker" in last
    )
    assert "served-data" not in done.stderr + done.stdout  # no server path


def test_a_forwarded_checkpoint_loaded_on_the_cpu_engine_is_refused_naming_it(
    twins: Twins,
) -> None:
    checkpoint = f"whitney://runs/{twins.chain.run_id}/states/cycle-0"
    with WhitneyClient(twins.broker.url, KEYS[0]) as client:
        session = client.open_session()
        run = client.create_run(session.session_id, "local", "local/tiny")
        with pytest.raises(InvalidRequest) as refused:
            client.run_operation(run.run_id, "load_state", {"checkpoint": checkpoint})
        assert client.get_run(run.run_id).step == 0
        client.close_session(session.session_id)
    assert refused.value.details["field"] == "payload.checkpoint"
    assert f"payload.checkpoint: checkpoint '{checkpoint}' was saved by a run forwarded" in str(
        refused.value
    )


def test_a_sweep_on_the_chain_gives_each_trial_its_emulated_twins_adapter(twins: Twins) -> None:
    with trials_of(twins.prefect_api, twins.tmp / "sweep") as env:
        chain = swept(twins.broker.url, env, "broker")
        cpu = swept(twins.front.url, env, "front")
    assert [(r["trial"], r["state"]) for r in chain] == [(0, "COMPLETED"), (1, "COMPLETED")]
    assert [r["score"] for r in chain] == [r["score"] for r in cpu]
    adapters = []
    for forwarded, emulated in zip(chain, cpu, strict=True):
        assert twins.forwarded(forwarded["run_id"])
        adapters.append(exported_sha256(twins.broker.url, forwarded["run_id"], twins.tmp))
        assert adapters[-1] == exported_sha256(twins.front.url, emulated["run_id"], twins.tmp)
    assert adapters[0] != adapters[1]
    assert adapters[0] == twins.chain.sha256  # the parent's settings (eval changes no weight)
