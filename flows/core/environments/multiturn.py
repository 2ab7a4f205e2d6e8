"""Multi-turn environments: an episode is several turns between the policy and an environment.

    episode = environment.episode(task, seed)      a fresh episode of a task
    observation = episode.initial_observation()    the first turn's prompt: text or messages
    result = episode.step(Completion(text, stopped))   the policy's action, sampled on the
                                                   transcript so far -> StepResult(observation,
                                                   reward, done)

An observation is text (one user turn) or a list of chat messages (`whitney.renderers.Message`,
a `tool` turn for instance), which the flow renders with its renderer; an action is the text
the renderer parses from the sampled tokens. The flow samples every turn of every running
episode together, appends each action and the observation that answers it to the episode's
transcript (flows.rl.multi_turn_transcripts), and ends an episode when its step
says `done` (or a rollout limit cuts it). The episode's reward is the sum of its steps'
rewards. The G episodes of a group get the same `task`, so their rewards can be compared
(GRPO); each gets a `seed` of its own, for an environment with randomness of its own (a new
one for every attempt and every resampling).

Exactly-once needs an environment that answers the same way to the same actions: given its
task, its seed and the actions so far, `initial_observation` and `step` must be
deterministic, as `Environment.reward` is. A retried cycle then replays: its samples come back
from Whitney's journal and its episodes take the same turns.

An environment whose actions are short can bound them: `max_action_tokens` (an int) caps the
tokens sampled per turn, below the config's `max_tokens`. An environment that does I/O (a
tool, a sandbox, a remote grader) sets `io` to an `EnvironmentIO`: its `initial_observation`
and `step` calls then run as Prefect tasks with retries, a timeout and a concurrency limit
(`flows.core.environments.calls`). A step that raises must leave its episode as it was, so
that a retry can call it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pydantic import Field

from flows.core.environments import Completion
from flows.core.fields import Settings
from whitney.renderers import Prompt


@dataclass(frozen=True)
class StepResult:
    """What an environment answers to an action."""

    observation: Prompt
    """What follows the action in the transcript (text or messages): the next turn's prompt
    ends with it, rendered. Unused once the episode is done."""
    reward: float
    """This turn's contribution to the episode's reward."""
    done: bool
    """The episode is over."""


@runtime_checkable
class Episode(Protocol):
    """One episode: its first observation, then one step per action."""

    def initial_observation(self) -> Prompt:
        """The first turn's prompt: text or messages."""
        ...

    def step(self, action: Completion) -> StepResult:
        """Answer the policy's action (parsed; `stopped` when it ended on a stop token)."""
        ...


@runtime_checkable
class MultiTurnEnvironment(Protocol):
    """Episodes of seeded tasks. May set `max_action_tokens` (an int: the most tokens of an
    action) and `io` (an `EnvironmentIO`, when its calls do I/O)."""

    def episode(self, task: int, seed: int) -> Episode:
        """A fresh episode of the task `task` names (shared by a group's episodes), with its
        own `seed`; the same arguments give the same episode."""
        ...


class EnvironmentIO(Settings):
    """How the calls of an environment that does I/O run: each `initial_observation` and
    `step` is a Prefect task, retried on any exception, cut after `timeout_s`, and at most
    `concurrency` of them run at once in a cycle."""

    retries: int = Field(default=2, ge=0, le=20, description="Retries of a failed call")
    retry_delay_s: float = Field(default=1.0, ge=0, le=600, description="Delay before a retry")
    timeout_s: float = Field(
        default=60.0, gt=0, le=86_400, description="A call still running after this fails"
    )
    concurrency: int = Field(
        default=8, ge=1, le=1024, description="Calls of one cycle running at once"
    )


def environment_io(environment: object) -> EnvironmentIO | None:
    """The I/O declaration of an environment (its `io`), None when it does none; TypeError if
    `io` is set to something else."""
    io = getattr(environment, "io", None)
    if io is not None and not isinstance(io, EnvironmentIO):
        raise TypeError(f"{type(environment).__name__}.io must be an EnvironmentIO, got {io!r}")
    return io


def max_action_tokens(environment: object) -> int | None:
    """The most tokens an action of the environment takes (its `max_action_tokens`), None
    when it sets none; TypeError if it is not a positive int."""
    limit = getattr(environment, "max_action_tokens", None)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise TypeError(
            f"{type(environment).__name__}.max_action_tokens must be a positive int, got {limit!r}"
        )
    return limit
