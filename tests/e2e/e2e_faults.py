"""Faults the e2e tests inject into deployed flow runs, by the RL config's `env` import
path (`e2e_faults:FailOnceAtCycle1`; the stack puts this directory on the worker's PYTHONPATH).

`FailOnceAtCycle1` is the built-in digits environment, except that scoring cycle 1 raises, once
per top-level flow run: after that cycle's `save_weights_for_sampler` and `sample` operations
completed on Whitney, and before its `forward_backward`. Its prompts and rewards are the digits
environment's, so a run that recovers from the fault must end with exactly the adapter of an
undisturbed run of the same config. The "once" is a marker file under E2E_FAULT_DIR, so it
holds across processes (a flow run retried from the UI starts a new one).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from flows.core.environments import Completion
from flows.core.environments.digits import DigitsEnvironment

FAIL_CYCLE = 1
HOLD_LIMIT_S = 300.0
"""The longest a held cycle waits for its release (a test that died never sends it), unless
E2E_HOLD_LIMIT_S says otherwise."""


class InjectedFault(RuntimeError):
    """The e2e fault."""


class FailOnceAtCycle1(DigitsEnvironment):
    def __init__(self) -> None:
        self._cycle: int | None = None

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        self._cycle = cycle
        return super().prompts(cycle, count, seed)

    def reward(self, prompt: str, completion: Completion) -> float:
        if self._cycle == FAIL_CYCLE:
            self._fail_once()
        return super().reward(prompt, completion)

    def _fail_once(self) -> None:
        from prefect.runtime import flow_run

        marker = Path(os.environ["E2E_FAULT_DIR"]) / f"{flow_run.root_flow_run_id}-{FAIL_CYCLE}"
        if marker.exists():
            return
        marker.touch()
        raise InjectedFault(f"e2e fault: cycle {FAIL_CYCLE} fails once, after sampling")


class FaultsFromEnv(DigitsEnvironment):
    """The digits environment, with the faults the flow run's environment asks for (the
    deployment's job variables set them per flow run; a resumed run inherits them):

    - E2E_CRASH_AT_CYCLE=n: the flow run's process SIGKILLs itself when cycle n asks for its
      prompts; with E2E_CRASH_TOKEN=t, only the first process that gets there (the marker
      `crashed-t`), else every one (a run that crashes again at the same cycle);
    - E2E_HOLD_AT_CYCLE=n with E2E_HOLD_TOKEN=t: scoring cycle n (after its samples) writes
      the marker `held-t` and waits until the file `release-t` exists (at most
      E2E_HOLD_LIMIT_S, default HOLD_LIMIT_S), once.

    Without them it is the digits environment, so every run of it ends with the adapter of
    the same config on `digits`.
    """

    def __init__(self) -> None:
        self._cycle: int | None = None

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        self._cycle = cycle
        if cycle == int(os.environ.get("E2E_CRASH_AT_CYCLE", "-1")):
            token = os.environ.get("E2E_CRASH_TOKEN")
            marker = Path(os.environ["E2E_FAULT_DIR"]) / f"crashed-{token}"
            if token is None or not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
        return super().prompts(cycle, count, seed)

    def reward(self, prompt: str, completion: Completion) -> float:
        if self._cycle == int(os.environ.get("E2E_HOLD_AT_CYCLE", "-1")):
            self._hold_once(os.environ["E2E_HOLD_TOKEN"])
        return super().reward(prompt, completion)

    @staticmethod
    def _hold_once(token: str) -> None:
        faults = Path(os.environ["E2E_FAULT_DIR"])
        held, release = faults / f"held-{token}", faults / f"release-{token}"
        if held.exists():
            return
        held.touch()
        deadline = time.monotonic() + float(os.environ.get("E2E_HOLD_LIMIT_S") or HOLD_LIMIT_S)
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
