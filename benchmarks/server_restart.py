"""What a Whitney server restart costs a running flow: the same RL flow (`whitney-flows run rl
--api-url`) against a served Whitney twice, undisturbed and with the server SIGKILLed and
started again on the same port and data directory right after cycle K. Prints the server's
time away (kill to ready), its rebuild of the run (from its log), the disturbed cycle against
the same cycle undisturbed, both wall times and whether the adapters' sha256 are equal.

    python benchmarks/server_restart.py [--cycles 12] [--kill-after 6] [--base-model local/tiny]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READY = re.compile(r"ready at (http://\S+)")
REBUILT = re.compile(r"rebuilt after the restart in ([\d.]+) s \((.+?)\)")


class Server:
    """`whitney-flows serve` in its own process, which can be killed and started again."""

    def __init__(self, data_dir: Path, api_key: str) -> None:
        self.data_dir, self.api_key, self.port = data_dir, api_key, "0"
        self.log = data_dir / "serve.log"
        self.url = ""
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> float:
        """Start it; seconds until it printed its ready line."""
        started = time.monotonic()
        command = [sys.executable, "-m", "flows.cli.main", "serve", "--port", self.port]
        command += ["--data-dir", str(self.data_dir / "data")]
        environment = {**os.environ, "WHITNEY_LOCAL_API_KEYS": self.api_key}
        with self.log.open("a") as log:
            seen = len(READY.findall(self.log.read_text()))
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, text=True, env=environment
            )
        while len(found := READY.findall(self.log.read_text())) == seen:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited: {self.log.read_text()}")
            time.sleep(0.02)
        self.url = found[-1]
        self.port = self.url.rsplit(":", 1)[1]
        return time.monotonic() - started

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


def run_flow(
    server: Server, workdir: Path, name: str, arguments: list[str], kill_after: int | None
) -> tuple[float, list[float], str, float | None]:
    """One flow: wall seconds, the time at which each cycle's metrics line appeared, the
    adapter's sha256 and, when the server was killed after cycle `kill_after`, its time away."""
    directory = workdir / name
    directory.mkdir()
    metrics, adapters = directory / "metrics.jsonl", directory / "adapters"
    environment = {**os.environ, "WHITNEY_API_KEY": server.api_key}
    environment["PREFECT_HOME"] = str(workdir / "prefect-home")
    command = [sys.executable, "-m", "flows.cli.main", "run", "rl", "--api-url", server.url]
    command += [*arguments, "--metrics-out", str(metrics), "--adapter-dir", str(adapters)]
    started = time.monotonic()
    stamps: list[float] = []
    away = None
    with (directory / "log").open("w") as log:
        flow = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
        while flow.poll() is None:
            lines = len(metrics.read_text().splitlines()) if metrics.exists() else 0
            while len(stamps) < lines:
                stamps.append(time.monotonic() - started)
            if kill_after is not None and away is None and lines >= kill_after:
                server.kill()
                away = server.start()
                print(f"  killed after cycle {kill_after}; ready again in {away:.2f} s", flush=True)
            time.sleep(0.02)
    if flow.returncode != 0:
        raise RuntimeError(f"flow {name} exited {flow.returncode}: see {directory / 'log'}")
    lines = len(metrics.read_text().splitlines())
    stamps += [time.monotonic() - started] * (lines - len(stamps))
    (adapter,) = adapters.iterdir()
    return (
        time.monotonic() - started,
        stamps,
        hashlib.sha256(adapter.read_bytes()).hexdigest(),
        away,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--kill-after", type=int, default=6)
    parser.add_argument("--base-model", default="local/tiny")
    options = parser.parse_args()
    arguments = ["--cycles", str(options.cycles), "--base-model", options.base_model]
    with tempfile.TemporaryDirectory(prefix="whitney-restart-") as scratch:
        workdir = Path(scratch)
        server = Server(workdir, secrets.token_hex(16))
        server.start()
        try:
            print(f"undisturbed: {options.cycles} cycles of {options.base_model}", flush=True)
            plain, plain_stamps, plain_sha, _ = run_flow(server, workdir, "plain", arguments, None)
            print(f"disturbed: SIGKILL + restart after cycle {options.kill_after}", flush=True)
            hit, hit_stamps, hit_sha, away = run_flow(
                server, workdir, "killed", arguments, options.kill_after
            )
        finally:
            server.stop()
        rebuilds = REBUILT.findall(server.log.read_text())
    k = options.kill_after
    plain_cycle = plain_stamps[k] - plain_stamps[k - 1]
    hit_cycle = hit_stamps[k] - hit_stamps[k - 1]
    print()
    print(f"server away (SIGKILL to ready):  {away:.2f} s")
    for seconds, how in rebuilds:
        print(f"run rebuilt in:                  {float(seconds):.2f} s ({how})")
    print(f"cycle {k + 1}, undisturbed:          {plain_cycle:.2f} s")
    print(
        f"cycle {k + 1}, through the restart:  {hit_cycle:.2f} s ({hit_cycle / plain_cycle:.1f}x)"
    )
    print(f"flow wall time:                  {plain:.1f} s undisturbed, {hit:.1f} s disturbed")
    print(f"adapter sha256 equal:            {plain_sha == hit_sha} ({plain_sha[:16]}...)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
