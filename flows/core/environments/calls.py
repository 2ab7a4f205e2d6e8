"""Calling a multi-turn environment: inline, or as Prefect tasks when it declared I/O.

`EnvironmentCalls.run(calls)` runs a batch of named calls (every episode's step of one turn)
and answers, in the batch's order, each call's result or the exception it raised for good.
An environment without `io` is called inline, one call after another. One with `io` gets a
task per call (`tasks.environment`): retried, cut after its timeout, and submitted so that
at most `io.concurrency` of the batch run at once. Either way the outcomes come back in
order, so what the flow does next does not depend on which call finished first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from prefect.futures import PrefectFuture
from prefect.utilities.annotations import quote

from flows.core.environments.multiturn import EnvironmentIO
from tasks.environment import environment_task


class NamedCall(NamedTuple):
    """One call: its task run name and the environment's method with its arguments bound."""

    name: str
    call: Callable[[], Any]


class EnvironmentCalls:
    """An environment's calls, inline (`io` None) or as tasks."""

    def __init__(self, io: EnvironmentIO | None) -> None:
        self.io = io

    def run(self, calls: Sequence[NamedCall]) -> list[Any]:
        """Each call's result, or the exception it raised after its retries, in order."""
        if self.io is None:
            return [outcome(lambda call=call: call.call()) for call in calls]
        task = environment_task(self.io.retries, self.io.retry_delay_s, self.io.timeout_s)
        futures: list[PrefectFuture[Any]] = []
        outcomes = []
        for index in range(len(calls)):
            while len(futures) < min(len(calls), index + self.io.concurrency):
                name, call = calls[len(futures)]
                futures.append(task.submit(name, quote(call)))
            outcomes.append(outcome(futures[index].result))
        return outcomes


def outcome(call: Callable[[], Any]) -> Any:
    """What `call` returns, or the exception it raises."""
    try:
        return call()
    except Exception as error:
        return error
