"""Multi-turn environments the flow tests load by import path (`flowtest_multiturn:...`), and
what the tests compute about them by hand."""

from __future__ import annotations

import random
import threading
import time

from flows.core.environments import Completion
from flows.core.environments.multiturn import EnvironmentIO, StepResult
from flows.core.environments.quiz import QuizEnvironment, QuizEpisode

TOOL_TURNS = 2
TOOL_IO = EnvironmentIO(retries=1, retry_delay_s=0.0, timeout_s=30.0, concurrency=3)


class ToolDown(RuntimeError):
    """The test tool's answer to a call it drew to fail."""


class FlakyToolEpisode:
    """Two turns of calls to a 'tool' that fails a seeded share of its calls: each call
    (the start and every step, retries included) draws from the tool's generator and fails
    when the draw is below `rate`. A failed call changes nothing else."""

    def __init__(self, tool: random.Random, rate: float) -> None:
        self.tool = tool
        self.rate = rate
        self.turn = 0

    def call_tool(self) -> None:
        if self.tool.random() < self.rate:
            raise ToolDown("the tool did not answer")

    def initial_observation(self) -> str:
        self.call_tool()
        return "Tool: "

    def step(self, action: Completion) -> StepResult:
        self.call_tool()
        self.turn += 1
        digits = sum(character.isdigit() for character in action.text)
        reward = digits / max(len(action.text), 1) / TOOL_TURNS
        return StepResult(" ok\nTool: ", reward, self.turn == TOOL_TURNS)


class FlakyTool:
    """A tool-style environment (declares I/O) whose calls fail at random, seeded: the tool
    of an episode is a generator seeded with the episode's seed, kept across a retried start
    (which makes the episode again)."""

    io = TOOL_IO
    rate = 0.3

    def __init__(self) -> None:
        self.tools: dict[int, random.Random] = {}

    def episode(self, task: int, seed: int) -> FlakyToolEpisode:
        return FlakyToolEpisode(self.tools.setdefault(seed, random.Random(seed)), self.rate)


class SteadyTool(FlakyTool):
    """The tool, calls always answered, inline (no I/O declared): for the token limit."""

    io = None
    rate = 0.0


def fails_for_good(seed: int, rate: float = FlakyTool.rate, retries: int = TOOL_IO.retries) -> bool:
    """Whether a FlakyTool episode with this seed fails, by hand: its start and each of its
    steps get `retries` + 1 draws, and a call whose draws all fail ends it."""
    rng = random.Random(seed)
    calls = range(1 + TOOL_TURNS)
    return any(all(rng.random() < rate for _ in range(retries + 1)) for _ in calls)


class QuizFailingOnce(QuizEnvironment):
    """The quiz, except that the first step of a second turn in this process raises: the
    cycle fails after its second turn's samples, and its replay goes through."""

    failed = threading.Event()

    def episode(self, task: int, seed: int) -> QuizEpisode:
        episode = super().episode(task, seed)
        step = episode.step

        def failing_step(action: Completion) -> StepResult:
            if episode.turn == 1 and not self.failed.is_set():
                self.failed.set()
                raise RuntimeError("injected: the quiz failed after the second turn")
            return step(action)

        episode.step = failing_step  # type: ignore[method-assign]
        return episode


class SlowQuiz(QuizEnvironment):
    """The quiz with 0.2 s steps, inline (no I/O declared): for the episode time limit."""

    def episode(self, task: int, seed: int) -> QuizEpisode:
        episode = super().episode(task, seed)
        step = episode.step

        def slow_step(action: Completion) -> StepResult:
            time.sleep(0.2)
            return step(action)

        episode.step = slow_step  # type: ignore[method-assign]
        return episode


class CountingTool:
    """A tool that counts how many of its steps run at once, and whose first step call in
    the process hangs past the timeout (and is not counted)."""

    io = EnvironmentIO(retries=2, retry_delay_s=0.0, timeout_s=1.0, concurrency=2)
    lock = threading.Lock()
    running = 0
    most = 0
    hung = threading.Event()

    def episode(self, task: int, seed: int) -> CountingEpisode:
        return CountingEpisode(self)


class CountingEpisode:
    def __init__(self, tool: CountingTool) -> None:
        self.tool = tool
        self.turn = 0

    def initial_observation(self) -> str:
        return "Count: "

    def step(self, action: Completion) -> StepResult:
        tool = type(self.tool)
        if not tool.hung.is_set():
            tool.hung.set()
            time.sleep(3.0)  # past the 1 s timeout: the task times out and is retried
            raise RuntimeError("answered too late")  # nobody waits for this answer any more
        with tool.lock:
            tool.running += 1
            tool.most = max(tool.most, tool.running)
        try:
            time.sleep(0.3)
        finally:
            with tool.lock:
                tool.running -= 1
        self.turn += 1
        return StepResult(" next\nCount: ", 0.5 * ("1" in action.text), self.turn == 2)
