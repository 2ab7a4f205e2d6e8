"""What `whitney-flows run` prints: one plain line per cycle as it happens when stdout is not a
terminal, a progress bar with an ETA on one, no Prefect telemetry notice, and a summary that
compares the first and last cycles and ends with the command that exports the adapter."""

from __future__ import annotations

import json
import os
import pty
import re
import statistics
import subprocess
from pathlib import Path

import pytest
from flowtest_cli import CONSOLE_SCRIPT
from prefect._internal.analytics.ci_detection import CI_ENV_VARS
from prefect.settings import PREFECT_API_URL

from flows.core.records.summary_parts import export_command, first_and_last
from whitney.local import EmbeddedWhitney

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NOTICE = "Prefect collects anonymous usage data"
CLOCK = r"\d+:\d\d:\d\d"
SMALL = ["--base-model", "local/nano", "--seed", "3"]


def environment(tmp_path: Path, **variables: str) -> dict[str, str]:
    """This session's Prefect API, a fresh Prefect home and data directory, no WHITNEY_API_*
    and no CI variable (Prefect's telemetry is off in CI anyway), plus `variables`."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("WHITNEY_API_") and name not in CI_ENV_VARS
    }
    kept.pop("DO_NOT_TRACK", None)
    return kept | {
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "COLUMNS": "200",
        **variables,
    }


def in_a_terminal(arguments: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """The console script with stdout and stderr on a pseudo-terminal: (exit code, output
    without its ANSI sequences)."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [str(CONSOLE_SCRIPT), *arguments],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
        env=env,
        cwd=cwd,
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    code = process.wait(timeout=400)
    return code, ANSI.sub("", b"".join(chunks).decode("utf-8", "replace"))


def test_first_and_last_never_overlap() -> None:
    cycles = list(range(12))
    windows = {n: first_and_last("x", cycles[:n], float, 5) for n in (0, 1, 2, 5, 10, 12)}
    assert windows[0] == []
    assert windows[1] == [("x, cycle", 0.0)]
    assert windows[2] == [("x, first cycle", 0.0), ("x, last cycle", 1.0)]
    assert windows[5] == [("x, first 2 cycles", 0.5), ("x, last 2 cycles", 3.5)]
    assert windows[10] == [("x, first 5 cycles", 2.0), ("x, last 5 cycles", 7.0)]
    assert windows[12] == [("x, first 5 cycles", 2.0), ("x, last 5 cycles", 9.0)]


def test_the_export_command_names_the_url_only_off_the_embedded_server() -> None:
    assert export_command("run-1", None) == "whitney-flows export run-1 --out exports/run-1"
    assert export_command("run-1", "https://w.example/api?x=1") == (
        "whitney-flows export run-1 --out exports/run-1 --api-url 'https://w.example/api?x=1'"
    )
    assert export_command("run-1", None, "/d/local 2") == (
        "whitney-flows export run-1 --out exports/run-1 --data-dir '/d/local 2'"
    )
    assert export_command("run-1", "https://w.example", "/d/local-2").endswith(
        "--api-url https://w.example"
    )


def test_piped_output_is_one_plain_line_per_cycle_as_it_happens(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    command = [str(CONSOLE_SCRIPT), "run", "rl", "--cycles", "4", *SMALL]
    process = subprocess.Popen(
        [*command, "--metrics-out", str(metrics)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(tmp_path),
        cwd=tmp_path,
    )
    lines = []
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("RL cycles 1/4"):
            running_after_the_first_cycle = process.poll() is None
    assert process.wait(timeout=400) == 0, process.stderr.read()
    assert process.stderr.read() == ""
    assert running_after_the_first_cycle  # the line came while the flow still ran
    cycles = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert lines[0].startswith("Embedded Whitney server at http://127.0.0.1:")
    assert lines[1] == "RL cycles 0/4  starting Prefect and the first cycle"
    for done, (line, cycle) in enumerate(zip(lines[2:6], cycles, strict=True), start=1):
        metrics = (
            f"reward {cycle['reward_mean']:.3f}  loss {cycle['loss']:+.3f}  "
            f"grad_norm {cycle['grad_norm']:.3f}"
        )
        pattern = (
            re.escape(f"RL cycles {done}/4  {metrics}  ") + rf"{CLOCK} elapsed(, ETA {CLOCK})?"
        )
        assert re.fullmatch(pattern, line), (pattern, line)
    assert any(", ETA " in line for line in lines[3:5])  # the pace is known from cycle 2 on
    assert ", ETA " not in lines[2] + lines[5]
    summary = "\n".join(lines[6:])
    rewards = [cycle["reward_mean"] for cycle in cycles]
    assert f"reward, first 2 cycles │ {statistics.fmean(rewards[:2]):.3f}" in summary
    assert f"reward, last 2 cycles  │ {statistics.fmean(rewards[2:]):.3f}" in summary
    (run_id,) = re.findall(r"Whitney run\s+│ (run-[0-9a-f]+)", summary)
    assert lines[-1] == f"Export the adapter: whitney-flows export {run_id} --out exports/{run_id}"
    assert NOTICE not in summary


def test_a_terminal_gets_a_progress_bar_with_an_eta_and_no_telemetry_notice(
    embedded_server: EmbeddedWhitney, tmp_path: Path
) -> None:
    env = environment(tmp_path, WHITNEY_API_KEY=embedded_server.api_key)
    arguments = ["run", "rl", "--cycles", "3", *SMALL, "--api-url", embedded_server.url]
    code, output = in_a_terminal(arguments, env, tmp_path)
    assert code == 0, output
    assert re.search(rf"RL cycles .*━.* 2/3 .* ETA {CLOCK}", output), output
    assert NOTICE not in output
    assert embedded_server.api_key not in output
    (run_id,) = set(re.findall(r"Whitney run\s+│ (run-[0-9a-f]+)", output))
    export = f"whitney-flows export {run_id} --out exports/{run_id} --api-url {embedded_server.url}"
    assert f"Export the adapter: {export}" in output


@pytest.mark.parametrize(("do_not_track", "notice"), [(None, False), ("0", True)])
def test_the_telemetry_notice_is_off_unless_the_user_turns_it_on(
    do_not_track: str | None, notice: bool, tmp_path: Path
) -> None:
    """A fresh Prefect home on a terminal is where Prefect prints its notice; `--cycles 0` is
    refused (exit 2) right after Prefect is imported."""
    variables = {} if do_not_track is None else {"DO_NOT_TRACK": do_not_track}
    code, output = in_a_terminal(
        ["run", "rl", "--cycles", "0"], environment(tmp_path, **variables), tmp_path
    )
    assert code == 2
    assert (NOTICE in output) is notice, output
