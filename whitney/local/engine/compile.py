"""Compile the engine's kernels into the user's cache now, at this process's priority, and load
them, printing progress: `python -m whitney.local.engine.compile`. An engine run otherwise compiles
them in the background at the lowest priority when it first needs them (`kernels`); the test
suite starts this at its start, so its processes load compiled kernels instead of each waiting."""

from __future__ import annotations

import logging
import sys
import threading
import time

from whitney.local.engine import kernels

PROGRESS_S = 15.0


def report_progress(done: threading.Event, started: float) -> None:
    """Print how many of the kernels' packages are in the cache, every PROGRESS_S."""
    directory = kernels.compiled_directory()
    total = len(kernels.STATE.kernels)
    while not done.wait(PROGRESS_S):
        packaged = sum((directory / kernels.package(n)).exists() for n in range(total))
        elapsed = time.perf_counter() - started
        print(f"engine kernels: {packaged} of {total} compiled ({elapsed:.0f} s)", flush=True)


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    reason = kernels.unavailable()
    if reason is not None:
        print(f"engine kernels: {reason}; the engine runs eager (the same bits)", flush=True)
        return 0
    started = time.perf_counter()
    directory = kernels.compiled_directory()
    print(f"engine kernels: compiling into {directory} (if not there yet)", flush=True)
    done = threading.Event()
    threading.Thread(target=report_progress, args=(done, started), daemon=True).start()
    loaded = kernels.compile_now()
    done.set()
    elapsed = time.perf_counter() - started
    state = "compiled and loaded" if loaded else "failed: the engine runs eager (the same bits)"
    print(f"engine kernels: {state} in {elapsed:.0f} s", flush=True)
    return 0 if loaded else 1


if __name__ == "__main__":
    sys.exit(main())
