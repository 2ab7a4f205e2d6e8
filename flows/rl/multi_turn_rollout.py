"""Episodes of a multi-turn environment, played turn by turn on reserved blocks of seq ids.

    rollout(specs, draw)
      start                    each episode: environment.episode(task, seed), then
                               initial_observation()
      turn 0, 1, ...           while an episode runs:
        limits                 max_turns, max_episode_tokens, episode_timeout_s cut an episode
        sample[seq=k..k+n-1]   one request per distinct transcript of a group (a group's first
                               turn: one request, num_samples = its episodes), max_tokens the
                               least of max_tokens, the environment's max_action_tokens and the
                               room left; a reserved block of seq ids, submitted together (or
                               one after another)
        step                   each action, decoded, to its episode -> observation, reward, done
        next prompt            transcript + action + observation, rendered by the plan's
                               renderer (flows.rl.multi_turn_transcripts)

Each turn's requests, their order and their seeds depend only on the episodes' transcripts:
the seed of a request is derived from (config seed, cycle, draw, group, turn, first episode
of the request), an episode's own seed from (config seed, cycle, draw, group, member). So a
retried cycle makes the same requests on the same seq ids and its samples come back from
Whitney's journal, as long as the environment answers the same actions the same way
(flows.core.environments.multiturn).

An environment call that fails (after its retries, when the environment does I/O) ends its
episode as `failed`; `stop_on_failure` raises `EpisodeFailed` instead, once the turn's calls
are done. What else becomes of a failed episode is the cycle's failure policy
(flows.rl.multi_turn_batch).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flows.core.environments import Completion
from flows.core.environments.calls import EnvironmentCalls, NamedCall
from flows.core.environments.multiturn import Episode, MultiTurnEnvironment, StepResult
from flows.core.loop.context import CycleContext
from flows.core.loop.plans import derive_seed
from flows.rl.multi_turn_transcripts import Turn, first_prompt, next_prompt
from flows.rl.plan import RLPlan
from tasks.operations import Call
from whitney.payloads import sample_request
from whitney.renderers import Prompt, Transcript, check_messages

DONE, MAX_TURNS, EPISODE_TOKENS, TIME, FAILED = (
    "done",
    "max_turns",
    "episode_tokens",
    "time",
    "failed",
)
STOP_REASONS = (DONE, MAX_TURNS, EPISODE_TOKENS, TIME, FAILED)
"""Why an episode ended: its environment said done; a limit cut it (turns, transcript tokens,
wall time); an environment call failed."""
LIMITS = frozenset({MAX_TURNS, EPISODE_TOKENS, TIME})


class EpisodeFailed(RuntimeError):
    """An episode's environment call failed, and the failure policy allows none."""


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to play: member `member` of group `group`, whose task is `task`."""

    group: int
    member: int
    task: int
    attempt: int = 0
    """0 for the first; retry_episode's further attempts count up."""

    @property
    def label(self) -> str:
        """`G.M`, with `/aN` for attempt N > 0."""
        return f"{self.group}.{self.member}" + (f"/a{self.attempt}" if self.attempt else "")


@dataclass
class EpisodeResult:
    """An episode as it was played: its turns, the environment's answers, why it ended."""

    spec: EpisodeSpec
    draw: int
    """Which rollout of the cycle played it (0: the first; retries and resampling count up)."""
    turns: list[Turn] = field(default_factory=list)
    observations: list[Prompt] = field(default_factory=list)
    """The initial observation, then the answer to each action (one fewer on a failure)."""
    step_rewards: list[float] = field(default_factory=list)
    stop: str | None = None
    error: str | None = None
    started: float = 0.0
    """When its start began (time.monotonic), for the time limit."""
    episode: Episode | None = field(default=None, repr=False)
    transcript: Transcript | None = field(default=None, repr=False)
    """The transcript so far while it runs (flows.rl.multi_turn_transcripts)."""
    action: str = ""
    """Its last action, as the renderer parsed it."""

    @property
    def prompt(self) -> list[int]:
        """The next turn's prompt: the transcript so far."""
        return self.transcript.tokens if self.transcript is not None else []

    def reward(self, limit_reward: float | None) -> float:
        """The sum of its steps' rewards; `limit_reward` instead, if set and a limit cut it."""
        if self.stop in LIMITS and limit_reward is not None:
            return limit_reward
        return sum(self.step_rewards)

    def end(self, stop: str, error: BaseException | None = None) -> None:
        self.stop = stop
        self.error = None if error is None else f"{type(error).__name__}: {error}"
        self.episode = None
        self.transcript = None


def rollout(
    plan: RLPlan,
    ctx: CycleContext,
    sampler_id: str,
    specs: Sequence[EpisodeSpec],
    draw: int,
    *,
    stop_on_failure: bool = False,
) -> list[EpisodeResult]:
    """Play the episodes of `specs` to their end in the cycle of `ctx`, every turn of them
    together, sampled from `sampler_id` of its policy run; their results in the order of
    `specs`."""
    client, cycle = ctx.client, ctx.cycle
    environment = plan.environment
    assert isinstance(environment, MultiTurnEnvironment)
    calls = EnvironmentCalls(plan.io)
    episodes = [EpisodeResult(spec, draw) for spec in specs]
    config = plan.config
    starts = [
        NamedCall(
            f"env_start[episode={spec.label}]",
            functools.partial(
                start,
                environment,
                spec.task,
                derive_seed(config.seed, cycle, draw, spec.group, spec.member),
            ),
        )
        for spec in specs
    ]
    with client.log.timing("environment"):
        outcomes = calls.run(starts)
    for episode, started in zip(episodes, outcomes, strict=True):
        if isinstance(started, BaseException):
            episode.end(FAILED, started)
            continue
        episode.episode, observation, episode.started = started
        episode.observations.append(observation)
        episode.transcript = first_prompt(plan.renderer, observation)
    raise_failures(episodes, stop_on_failure)
    turn = 0
    while running := [episode for episode in episodes if episode.stop is None]:
        running = [episode for episode in running if within_limits(plan, episode)]
        if running:
            sample_turn(plan, ctx, sampler_id, running, draw, turn)
            with client.log.timing("environment"):
                step_turn(plan, calls, running, turn)
            raise_failures(running, stop_on_failure)
        turn += 1
    return episodes


def start(environment: MultiTurnEnvironment, task: int, seed: int) -> tuple[Episode, Prompt, float]:
    """A fresh episode of `task` with its own `seed`, its initial observation, and when it
    started (time.monotonic, for the time limit)."""
    started = time.monotonic()
    episode = environment.episode(task, seed)
    observation = checked_observation(episode.initial_observation(), "initial_observation()")
    return episode, observation, started


def within_limits(plan: RLPlan, episode: EpisodeResult) -> bool:
    """False (and the episode ended) if a limit cuts it before its next turn."""
    limits = plan.config.rollout
    timeout = limits.episode_timeout_s
    if len(episode.prompt) >= limits.max_episode_tokens:
        episode.end(EPISODE_TOKENS)
    elif timeout is not None and time.monotonic() - episode.started > timeout:
        episode.end(TIME)
    return episode.stop is None


def turn_requests(
    plan: RLPlan, cycle: int, episodes: Sequence[EpisodeResult], draw: int, turn: int
) -> list[tuple[dict[str, Any], list[EpisodeResult]]]:
    """The turn's sample requests, each with the episodes it samples for (in order): one per
    distinct transcript of a group."""
    config = plan.config
    shared: dict[tuple[int, tuple[int, ...]], list[EpisodeResult]] = {}
    for episode in episodes:
        shared.setdefault((episode.spec.group, tuple(episode.prompt)), []).append(episode)
    requests = []
    for (group, prompt), members in shared.items():
        room = config.rollout.max_episode_tokens - len(prompt)
        seed = derive_seed(config.seed, cycle, draw, group, turn, members[0].spec.member)
        request = sample_request(
            list(prompt),
            len(members),
            max_tokens=min(plan.action_tokens, room),
            temperature=config.temperature,
            stop_token_ids=list(plan.renderer.stop_tokens),
            seed=seed,
        )
        requests.append((request, members))
    return requests


def sample_turn(
    plan: RLPlan,
    ctx: CycleContext,
    sampler_id: str,
    episodes: Sequence[EpisodeResult],
    draw: int,
    turn: int,
) -> None:
    """Sample every running episode's action of this turn, on the policy run's next seq ids."""
    requests = turn_requests(plan, ctx.cycle, episodes, draw, turn)
    calls = [Call("sample", request, sampler_id) for request, _ in requests]
    operations = ctx.client.run_calls(ctx.run_id, calls, together=plan.config.concurrent_sampling)
    for (_, members), operation in zip(requests, operations, strict=True):
        sequences = (operation.result or {})["sequences"]
        for episode, sequence in zip(members, sequences, strict=True):
            turn_taken = Turn(
                prompt=tuple(episode.prompt),
                action=tuple(sequence["tokens"]),
                logprobs=tuple(float(value) for value in sequence["logprobs"]),
                stop_reason=sequence["stop_reason"],
                seq_id=operation.seq_id,
            )
            episode.turns.append(turn_taken)
            assert episode.transcript is not None
            reply = episode.transcript.add_completion(
                list(turn_taken.action), list(turn_taken.logprobs)
            )
            episode.action = reply["content"]


def step_turn(
    plan: RLPlan, calls: EnvironmentCalls, episodes: Sequence[EpisodeResult], turn: int
) -> None:
    """Send each episode its action; record the answers, end the episodes that are over."""
    steps = []
    for episode in episodes:
        completion = Completion(episode.action, episode.turns[-1].stop_reason == "stop")
        steps.append(
            NamedCall(
                f"env_step[episode={episode.spec.label}, turn={turn}]",
                functools.partial(checked_step, episode.episode, completion),
            )
        )
    for episode, result in zip(episodes, calls.run(steps), strict=True):
        if isinstance(result, BaseException):
            episode.end(FAILED, result)
            continue
        episode.observations.append(result.observation)
        episode.step_rewards.append(float(result.reward))
        if result.done:
            episode.end(DONE)
        elif len(episode.turns) >= plan.config.rollout.max_turns:
            episode.end(MAX_TURNS)
        else:
            assert episode.transcript is not None
            next_prompt(episode.transcript, result.observation)


def checked_step(episode: Episode | None, action: Completion) -> StepResult:
    """`episode.step(action)`, TypeError unless it answers a StepResult."""
    assert episode is not None
    result = episode.step(action)
    if not isinstance(result, StepResult):
        raise TypeError(f"step() returned {type(result).__name__}, not a StepResult")
    checked_observation(result.observation, "step().observation")
    return result


def checked_observation(observation: object, where: str) -> Prompt:
    """`observation` if it is text or a list of messages; ValueError naming `where` if not."""
    if isinstance(observation, str):
        return observation
    return check_messages(observation, where)


def raise_failures(episodes: Sequence[EpisodeResult], stop_on_failure: bool) -> None:
    """EpisodeFailed naming the first failed episode, if `stop_on_failure`."""
    if not stop_on_failure:
        return
    for episode in episodes:
        if episode.stop == FAILED:
            raise EpisodeFailed(f"{failure_text(episode)} (rollout.failure_policy fail_fast)")


def failure_text(episode: EpisodeResult) -> str:
    """Which episode failed, where, and why."""
    where = f"turn {len(episode.turns) - 1}" if episode.turns else "its start"
    return f"episode {episode.spec.label} failed at {where}: {episode.error}"
