"""SFT, distillation and DPO on the chain: `whitney-flows run` (a Prefect flow) against a broker
that forwards provider `tinker` runs through the official SDK to the embedded Tinker front,
and against the front itself (the same runs emulated on the CPU engine): the same adapter,
bit for bit (a few cycles on `local/tiny`). The runs share one Prefect server (`prefect_api`)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.local.served import ServedWhitney, served
from tests.tinker.steps import KEYS, sdk_key
from tests.tinker.test_tinker_provider import tinker_key

ROOT = Path(__file__).resolve().parents[2]
FLOWS = {
    "distill": ["--cycles", "2", "--sft-steps", "2"],
    "dpo": ["--cycles", "2", "--data", str(ROOT / "examples" / "dpo-pairs.jsonl")],
    "sft": ["--steps", "2"],
}


def environment(tmp: Path, prefect_api: str | None) -> dict[str, str]:
    """The CLI's environment: tenant A's key, Prefect and data homes of its own, the Prefect
    API at `prefect_api` (None: the CLI starts Prefect's ephemeral server in its home)."""
    env = os.environ | {
        "WHITNEY_API_KEY": KEYS[0],
        "PREFECT_HOME": str(tmp / "prefect"),
        "XDG_DATA_HOME": str(tmp / "xdg"),
    }
    env.pop("PREFECT_API_URL", None)
    if prefect_api is not None:
        env["PREFECT_API_URL"] = prefect_api
    for home in ("prefect", "xdg"):
        (tmp / home).mkdir(parents=True, exist_ok=True)
    return env


def adapter_of(flow: str, api_url: str, tmp: Path, prefect_api: str) -> str:
    """The sha256 of the adapter `whitney-flows run FLOW --provider tinker` downloads."""
    env = environment(tmp, prefect_api)
    argv = [sys.executable, "-m", "flows.cli.main", "run", flow, "--provider", "tinker"]
    argv += [*FLOWS[flow], "--api-url", api_url, "--adapter-dir", str(tmp / "out")]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=900, check=False, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (adapter,) = (tmp / "out").glob("*-adapter.tar")
    return hashlib.sha256(adapter.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def broker(
    server: ServedWhitney, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServedWhitney]:
    """A served broker forwarding provider `tinker` runs to `server` (the front), for the three
    flows."""
    tmp = tmp_path_factory.mktemp("flows-broker")
    with tinker_key(sdk_key(0)), served(tmp, "--tinker-url", server.url, keys=KEYS) as process:
        yield process


@pytest.mark.parametrize("flow", sorted(FLOWS))
def test_a_flow_on_the_chain_gives_the_cpu_engines_adapter(
    server: ServedWhitney, broker: ServedWhitney, prefect_api: str, tmp_path: Path, flow: str
) -> None:
    forwarded = adapter_of(flow, broker.url, tmp_path / "chain", prefect_api)
    assert forwarded == adapter_of(flow, server.url, tmp_path / "cpu", prefect_api)
