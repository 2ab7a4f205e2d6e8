"""How far a reader walks in the layout (issue 41's measures), by tracing, not reading:

- the project files and lines one default RL cycle runs (each file with its lines run):
  `whitney-flows run rl --cycles 1` in process, traced (every thread) while the `rl-cycle`
  subflow runs, on a Whitney server in its own process (benchmarks/served.py: not traced);
- the walk of `learning_rate` from the command line to its HTTP request: the project files on
  the stack that submits the `optim_step` task, then on the stack that sends its request, in
  order (files visited, and returns to a file already visited);
- the largest class and function (lines), read with `ast`;
- duplicate pairs by the `duplicates` tool (when installed), whole tree and without tests/.

    python benchmarks/house_walk.py [--no-trace]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CODE = ("flows", "tasks", "blocks", "whitney_calls", "whitney")


def project_file(filename: str) -> str | None:
    """The repository-relative path of a project module, None for anything else."""
    try:
        relative = Path(filename).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    return relative if relative.split("/")[0] in CODE else None


def sending(request: Any) -> bytes:
    """The body of an httpx request about to be sent (b"" when it streams)."""
    try:
        return bytes(request.content)
    except Exception:  # noqa: BLE001 - a streamed body: not an operation's request
        return b""


def stack_files(frame: FrameType | None) -> list[str]:
    """The project files of the stack, outermost first."""
    files = []
    while frame is not None:
        path = project_file(frame.f_code.co_filename)
        if path is not None:
            files.append(path)
        frame = frame.f_back
    return files[::-1]


class Tracer:
    """Lines run by project code while the `rl-cycle` subflow runs, and the two stacks of the
    optim_step request."""

    def __init__(self) -> None:
        self.in_cycle = 0
        self.lines: dict[str, set[int]] = defaultdict(set)
        self.submit_stack: list[str] | None = None
        self.send_stack: list[str] | None = None
        self.lock = threading.Lock()

    def global_trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event != "call":
            return None
        if code.co_name == "submit" and self.submit_stack is None:
            task = frame.f_locals.get("self")
            if "optim_step" in str(getattr(task, "name", "")):
                self.submit_stack = stack_files(frame)
        if code.co_name == "send" and self.send_stack is None and "httpx" in code.co_filename:
            request = frame.f_locals.get("request")
            if request is not None and b'"optim_step"' in sending(request):
                self.send_stack = stack_files(frame)
        path = project_file(code.co_filename)
        if path is None:
            return None
        if code.co_name == "rl_cycle" and path.startswith("flows/rl/"):
            return self.cycle_trace(path)
        if self.in_cycle:
            self.lines[path].add(frame.f_lineno)
            return self.local_trace(path)
        return None

    def local_trace(self, path: str) -> Any:
        def trace(frame: FrameType, event: str, arg: Any) -> Any:
            if self.in_cycle and event == "line":
                self.lines[path].add(frame.f_lineno)
            return trace

        return trace

    def cycle_trace(self, path: str) -> Any:
        """The local trace of `rl_cycle`: the window is open until it returns."""
        with self.lock:
            self.in_cycle += 1
        inner = self.local_trace(path)

        def trace(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "return":
                with self.lock:
                    self.in_cycle -= 1
                return None
            inner(frame, event, arg)
            return trace

        return trace


def walk(files: list[str]) -> dict[str, Any]:
    """Files visited in order (runs of one file folded), distinct files, returns."""
    order = [path for index, path in enumerate(files) if index == 0 or files[index - 1] != path]
    seen: set[str] = set()
    returns = 0
    for path in order:
        returns += path in seen
        seen.add(path)
    return {"order": order, "files": len(seen), "returns": returns}


def import_project() -> None:
    """Import every module of the project first, so the trace sees the run, not the imports."""
    for package in CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - an optional extra missing: not part of the cycle
                continue


def warm_up(url: str) -> None:
    """One capabilities answer from the new server, however long it takes."""
    import os

    from whitney.client import WhitneyClient

    with WhitneyClient(url, os.environ["WHITNEY_API_KEY"], timeout=300) as client:
        client.capabilities()


def trace_cycle() -> dict[str, Any]:
    """Trace `whitney-flows run rl --cycles 1` in this process, on a server in its own."""
    from served import served_whitney

    from flows.cli.main import main

    import_project()
    tracer = Tracer()
    command = ["run", "rl", "--cycles", "1", "--adapter-dir"]
    with served_whitney(0.0) as url, tempfile.TemporaryDirectory(prefix="house-") as adapter_dir:
        command += [adapter_dir, "--api-url", url]
        warm_up(url)
        threading.settrace(tracer.global_trace)
        sys.settrace(tracer.global_trace)
        try:
            code = 2
            for _ in range(5):  # on a loaded machine the CLI's 2 s probe may time out: again
                code = main(command)
                if code != 2 or tracer.lines:
                    break
        finally:
            sys.settrace(None)
            threading.settrace(None)  # type: ignore[arg-type]
    if code != 0:
        raise SystemExit(f"run rl exited {code}")
    client = tracer.lines
    stack = (tracer.submit_stack or []) + (tracer.send_stack or [])
    return {
        "cycle_files": len(client),
        "cycle_lines_run": sum(len(lines) for lines in client.values()),
        "cycle_file_lines": sum(line_count(ROOT / path) for path in client),
        "cycle_files_list": {path: len(client[path]) for path in sorted(client)},
        "learning_rate_walk": walk(stack),
    }


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def largest() -> dict[str, Any]:
    """The longest class and function of the project's code (not tests, not benchmarks)."""
    best: dict[str, tuple[int, str]] = {"class": (0, ""), "function": (0, "")}
    for package in CODE:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    kind = "class"
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    kind = "function"
                else:
                    continue
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                where = f"{path.relative_to(ROOT).as_posix()}:{node.lineno} {node.name}"
                best[kind] = max(best[kind], (length, where))
    return {kind: {"lines": length, "at": where} for kind, (length, where) in best.items()}


def duplicate_pairs() -> dict[str, int | None]:
    """Pairs `duplicates` finds in the tracked tree, and in it without tests/."""
    if shutil.which("duplicates") is None:
        return {"whole_tree": None, "without_tests": None}

    def pairs(repo: Path) -> int:
        command = ["duplicates", "--repo", str(repo), "--seconds", "120"]
        first = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        match = re.match(r"(\d+) pairs", first)
        return int(match.group(1)) if match else 0

    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    with tempfile.TemporaryDirectory(prefix="house-dup-") as copy:
        for name in files:
            if name.startswith("tests/") or not (ROOT / name).is_file():
                continue
            target = Path(copy) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, target)
        return {"whole_tree": pairs(ROOT), "without_tests": pairs(Path(copy))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-trace", action="store_true", help="skip the traced RL cycle")
    options = parser.parse_args()
    report: dict[str, Any] = {"largest": largest(), "duplicates": duplicate_pairs()}
    if not options.no_trace:
        report |= trace_cycle()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
