"""A fault the e2e retry tests inject into deployed flow runs, by the RL config's `env` import
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
from pathlib import Path

from flows.core.environments import Completion
from flows.core.environments.digits import DigitsEnvironment

FAIL_CYCLE = 1


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
