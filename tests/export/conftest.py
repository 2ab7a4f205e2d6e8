"""Fixtures of the export tests: the shared embedded server (tests/conftest.py), one run
trained over HTTP and left active with a sampler of its final weights, and that run
exported by the command, as a PEFT directory and merged."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from whitney.local import EmbeddedWhitney

from .helpers import export, new_client, new_trained_run


@dataclass(frozen=True)
class Exported:
    run_id: str
    sampler_id: str
    peft_dir: Path
    merged_dir: Path


@pytest.fixture
def client(embedded_server: EmbeddedWhitney):
    """A client of its own per test: its seq ids come from the server, after any the command
    took (it submits export_lora itself)."""
    with new_client(embedded_server) as c:
        yield c


@pytest.fixture(scope="session")
def exported(embedded_server: EmbeddedWhitney, tmp_path_factory) -> Exported:
    """A trained local/nano run, its sampler `final`, and `export` of it both ways."""
    with new_client(embedded_server) as client:
        run_id = new_trained_run(client)
        client.run_operation(run_id, "save_weights_for_sampler", {"name": "final"})
    root = tmp_path_factory.mktemp("exported")
    where = {"url": embedded_server.url, "key": embedded_server.api_key}
    assert export(run_id, root / "adapter", **where) == 0
    assert export(run_id, root / "merged", "--merged", **where) == 0
    return Exported(run_id, "final", root / "adapter", root / "merged")
