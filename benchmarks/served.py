"""What the flow benchmarks share: a Whitney server in its own process, and Prefect set up as
`whitney-flows run` sets it (a quiet console, a batching ephemeral server that may take 3
minutes to start). Import it before anything that imports Prefect: Prefect reads its
settings from the environment when it is imported."""

from __future__ import annotations

import logging
import os
import re
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from flows.core.orchestration.prefect_env import set_prefect_env_defaults

if "prefect" in sys.modules:
    raise RuntimeError("import served before prefect: Prefect reads its settings when imported")
set_prefect_env_defaults()

READY = re.compile(r"ready at (http://\S+)")


@contextmanager
def served_whitney(latency_ms: float) -> Iterator[str]:
    """`whitney-flows serve` on a free port in a subprocess; yields its URL, sets the key
    (passed in the environment: never on a command line, where `ps` shows it)."""
    api_key = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="whitney-bench-") as data_dir:
        command = [sys.executable, "-m", "flows.cli.main", "serve", "--port", "0"]
        command += ["--data-dir", data_dir, "--latency-ms", str(latency_ms)]
        environment = {**os.environ, "WHITNEY_LOCAL_API_KEYS": api_key}
        server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=environment)
        try:
            assert server.stdout is not None
            for line in server.stdout:
                if match := READY.search(line):
                    break
            else:
                raise RuntimeError("the Whitney server did not start")
            os.environ["WHITNEY_API_KEY"] = api_key
            yield match.group(1)
        finally:
            server.terminate()
            server.wait(timeout=30)


def quiet_prefect() -> None:
    """Warnings only on the console (the API still gets every log)."""
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)
