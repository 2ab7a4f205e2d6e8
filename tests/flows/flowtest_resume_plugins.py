"""Plug-ins of the pipelining and resume tests, loaded by import path
(`flowtest_resume_plugins:...`), also by a `prefect flow-run retry` subprocess."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowtest_plugins import CycleAwareDigits

from flows.core.environments import Completion
from flows.core.environments.digits import DigitsEnvironment
from flows.rl.recipes import Recipe
from flows.rl.recipes.context import LossContext
from flows.rl.recipes.importance_sampling import build_loss as importance_sampling

if TYPE_CHECKING:
    import pytest

FAIL_AT_CYCLE_ENV = "FLOWTEST_FAIL_AT_CYCLE"
FAIL_MARKER_ENV = "FLOWTEST_FAIL_MARKER"


def fail_once_at_cycle(monkeypatch: pytest.MonkeyPatch, cycle: int, directory: Path) -> Path:
    """Make `cycle` of the next flow runs fail once (`fail_once_at`); the marker file that
    appears when it did."""
    marker = directory / "failed-once"
    monkeypatch.setenv(FAIL_AT_CYCLE_ENV, str(cycle))
    monkeypatch.setenv(FAIL_MARKER_ENV, str(marker))
    return marker


def fail_once_at(cycle: int, what: str) -> None:
    """Raise if `cycle` is $FLOWTEST_FAIL_AT_CYCLE and it has not failed yet: the first
    failure creates the file $FLOWTEST_FAIL_MARKER, and a marker that exists means it already
    failed. Without the two variables, nothing."""
    fail_at, marker = os.environ.get(FAIL_AT_CYCLE_ENV), os.environ.get(FAIL_MARKER_ENV)
    if fail_at is None or not marker or int(fail_at) != cycle:
        return
    try:
        Path(marker).touch(exist_ok=False)
    except FileExistsError:
        return
    raise RuntimeError(f"injected: the {what} of cycle {cycle} fails once")


class FailOnceAtCycle(CycleAwareDigits):
    """The digits environment, except that rewarding cycle $FLOWTEST_FAIL_AT_CYCLE raises,
    once (`fail_once_at`)."""

    def reward(self, prompt: str, completion: Completion) -> float:
        fail_once_at(self.cycle, "reward")
        return super().reward(prompt, completion)


class PromptsFailOnceAtCycle(DigitsEnvironment):
    """The digits prompts for a distillation, except that those of cycle
    $FLOWTEST_FAIL_AT_CYCLE raise, once (`fail_once_at`)."""

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        fail_once_at(cycle, "prompts")
        return super().prompts(cycle, count, seed)


def build_loss_refused_at_cycle_1(
    sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
) -> dict[str, Any]:
    """importance_sampling, except that cycle 1's payload names `ppo_critic`, which the server
    refuses for a policy run (422) before journaling it: its seq id stays a gap."""
    payload = importance_sampling(sample, cycle, request, ctx)
    if cycle == 1:
        payload = {**payload, "loss_function": "ppo_critic"}
    return payload


REFUSED_AT_CYCLE_1 = Recipe(
    name="importance_sampling",
    loss_function="importance_sampling",
    build_loss=build_loss_refused_at_cycle_1,
)
