"""A multi-turn cycle's middle: from episodes to the policy's forward_backward payload.

    draw                  each group's G episodes played together
                          (flows.rl.multi_turn_rollout), then
                          the failure policy (`rollout.failure_policy`):
                            fail_fast         a failed episode fails the cycle (Prefect
                                              retries it, replaying)
                            retry_episode     failed episodes played again from their start,
                                              a new draw per attempt, up to episode_retries;
                                              one still failing fails the cycle
                            min_viable_group  failed episodes left out; a group keeps at least
                                              min_viable_share of its episodes (and 2) or is
                                              dropped; the cycle fails if none is left
    rewards, advantages   per group: its episodes' rewards (a limit-cut episode's is
                          `limit_reward` when set) -> advantages
    resampling            uniform groups played again (`resample_rounds`), then dropped
    build_loss            per group, its episodes' transcripts
                          (flows.rl.multi_turn_transcripts): one
                          build_loss call per distinct prompt, with each sequence's episode
                          reward and advantage; then the recipe's finish_cycle
                          (flows.rl.batch.recipe_payload)

No group is trained on partially without a record: the cycle's `episodes` record counts the
failed, retried and dropped episodes and the dropped groups, and the flow run's log says so.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from prefect import get_run_logger

from flows.core.loop.context import CycleContext
from flows.core.loop.plans import derive_seed
from flows.rl.auxiliary import AuxiliaryHandle
from flows.rl.batch import (
    ADVANTAGE_ESTIMATORS,
    Group,
    GroupScore,
    LossCall,
    TrainingBatch,
    recipe_payload,
    resample_rounds,
)
from flows.rl.metrics import EpisodeStats, TurnRecord
from flows.rl.multi_turn_rollout import (
    FAILED,
    EpisodeFailed,
    EpisodeResult,
    EpisodeSpec,
    failure_text,
    rollout,
)
from flows.rl.multi_turn_transcripts import Turn, transcript_sequences
from flows.rl.plan import RLPlan
from whitney.payloads import sample_request


@dataclass(frozen=True)
class EpisodeGroup(Group):
    """A group of episodes as it goes to the loss: `episodes` are the ones trained on."""

    episodes: tuple[EpisodeResult, ...] = ()


@dataclass(eq=False, repr=False)
class Episodes:
    """The cycle's rollouts in order, each a new draw, and every episode they played."""

    plan: RLPlan
    ctx: CycleContext
    sampler_id: str
    played: list[EpisodeResult] = field(default_factory=list, init=False)
    draws: itertools.count[int] = field(default_factory=itertools.count, init=False)
    dropped: int = field(default=0, init=False)
    """Episodes left out of the loss for failures: failed ones, and non-viable draws'."""

    def play(self, specs: Sequence[EpisodeSpec]) -> list[EpisodeResult]:
        """One rollout of `specs` (a new draw)."""
        fail_fast = self.plan.config.rollout.failure_policy == "fail_fast"
        results = rollout(
            self.plan,
            self.ctx,
            self.sampler_id,
            specs,
            next(self.draws),
            stop_on_failure=fail_fast,
        )
        self.played += results
        return results

    def draw_group_episodes(self, groups: Sequence[int]) -> dict[int, list[EpisodeResult]]:
        """Each group's episodes that succeeded, after retry_episode's attempts: every one of
        them but under min_viable_group; EpisodeFailed if one is still failing."""
        config = self.plan.config
        specs = [
            EpisodeSpec(group, member, task=derive_seed(config.seed, self.ctx.cycle, group))
            for group in groups
            for member in range(config.group_size)
        ]
        results = self.play(specs)
        if config.rollout.failure_policy == "retry_episode":
            for attempt in range(1, config.rollout.episode_retries + 1):
                failed = [index for index, result in enumerate(results) if result.stop == FAILED]
                if not failed:
                    break
                retried = self.play([replace(results[i].spec, attempt=attempt) for i in failed])
                for index, result in zip(failed, retried, strict=True):
                    results[index] = result
            for result in results:
                if result.stop == FAILED:
                    raise EpisodeFailed(
                        f"{failure_text(result)}, after {config.rollout.episode_retries + 1} "
                        "attempts (rollout.failure_policy retry_episode)"
                    )
        by_group: dict[int, list[EpisodeResult]] = {group: [] for group in groups}
        for result in results:
            if result.stop != FAILED:
                by_group[result.spec.group].append(result)
        return by_group

    def viable(self, succeeded: Sequence[EpisodeResult]) -> bool:
        """Enough of a group's episodes succeeded to train on it."""
        config = self.plan.config
        needed = max(2, math.ceil(config.rollout.min_viable_share * config.group_size - 1e-9))
        return len(succeeded) >= needed

    def groups(self, indices: Sequence[int]) -> list[EpisodeGroup | None]:
        """The groups drawn: None for one that is not viable."""
        drawn = self.draw_group_episodes(indices)
        groups: list[EpisodeGroup | None] = []
        for index in indices:
            succeeded = drawn[index]
            viable = self.viable(succeeded)
            self.dropped += self.plan.config.group_size - (len(succeeded) if viable else 0)
            groups.append(episode_group(self.plan, index, succeeded) if viable else None)
        return groups


def episode_group(plan: RLPlan, index: int, episodes: Sequence[EpisodeResult]) -> EpisodeGroup:
    """The group of these episodes, scored (build_loss gets their transcripts from
    `loss_calls`, not from the group's sample and request)."""
    limit_reward = plan.config.rollout.limit_reward
    rewards = [episode.reward(limit_reward) for episode in episodes]
    score = GroupScore(rewards, ADVANTAGE_ESTIMATORS[plan.config.advantages](rewards))
    return EpisodeGroup(
        index=index,
        prompt=episodes[0].observations[0],
        request={},
        sample={},
        score=score,
        episodes=tuple(episodes),
    )


def loss_calls(plan: RLPlan, group: EpisodeGroup) -> list[LossCall]:
    """The group's transcripts as build_loss calls: one per distinct prompt (all the
    episodes' first segments share one), each sequence with its episode's reward and
    advantage."""
    by_prompt: dict[tuple[int, ...], LossCall] = {}
    for episode, reward, advantage in zip(
        group.episodes, group.score.rewards, group.score.advantages, strict=True
    ):
        for segment in transcript_sequences(episode.turns):
            key = tuple(segment.prompt)
            if key not in by_prompt:
                request = sample_request(segment.prompt, 1, max_tokens=plan.config.max_tokens)
                by_prompt[key] = LossCall({"sequences": []}, request, [], [])
            call = by_prompt[key]
            call.sample["sequences"].append(segment.sequence)
            call.rewards.append(reward)
            call.advantages.append(advantage)
    return [
        replace(call, request={**call.request, "num_samples": len(call.rewards)})
        for call in by_prompt.values()
    ]


def build_episode_batch(
    plan: RLPlan,
    ctx: CycleContext,
    sampler_id: str,
    auxiliary: Sequence[AuxiliaryHandle] = (),
) -> TrainingBatch:
    """Play the cycle's episodes, apply the failure policy, score, resample, and build the
    payload (every weight 0 if resampling dropped every group)."""
    config = plan.config
    cycle = ctx.cycle
    episodes = Episodes(plan, ctx, sampler_id)
    indices = list(range(config.prompts_per_cycle))
    drawn = episodes.groups(indices)
    first = [group for group in drawn if group is not None]
    if not first:
        raise EpisodeFailed(
            f"no group of cycle {cycle} kept min_viable_share "
            f"{config.rollout.min_viable_share} of its episodes (rollout.failure_policy "
            "min_viable_group)"
        )

    def redraw(pending: list[Group], round_number: int) -> list[Group]:
        again = episodes.groups([group.index for group in pending])
        return [new or old for old, new in zip(pending, again, strict=True)]

    groups = resample_rounds(first, config.resample_rounds, redraw)
    kept = [group for group in groups if not group.dropped]
    calls = [call for group in kept or groups[:1] for call in loss_calls(plan, group)]
    if not calls:
        raise EpisodeFailed(
            f"no episode of cycle {cycle} sampled an action: each was cut before its first "
            f"turn (rollout.max_episode_tokens {config.rollout.max_episode_tokens}, "
            f"rollout.episode_timeout_s {config.rollout.episode_timeout_s})"
        )
    payload, recipe_metrics = recipe_payload(
        plan, ctx, sampler_id, calls, auxiliary, train=bool(kept)
    )
    stats = episode_stats(episodes.played, episodes.dropped, drawn.count(None))
    if stats.failed or stats.dropped:
        get_run_logger().warning(
            "cycle %d: %d episodes failed, %d retried, %d left out of the loss, %d groups "
            "dropped for failures",
            cycle,
            stats.failed,
            stats.retried,
            stats.dropped,
            stats.groups_failed,
        )
    return TrainingBatch(
        payload=payload,
        scores=[group.score for group in first],
        groups_resampled=sum(group.resamples > 0 for group in groups),
        groups_dropped=sum(group.dropped for group in groups) + stats.groups_failed,
        recipe_metrics=recipe_metrics,
        episodes=stats,
    )


def observation_tokens(turns: Sequence[Turn]) -> list[int]:
    """Per turn, how many tokens of its prompt the environment wrote: the whole prompt of a
    first turn (or of one that does not extend the transcript), else what follows the
    previous action."""
    counts = []
    transcript: tuple[int, ...] = ()
    for turn in turns:
        extends = bool(transcript) and turn.prompt[: len(transcript)] == transcript
        counts.append(len(turn.prompt) - (len(transcript) if extends else 0))
        transcript = turn.prompt + turn.action
    return counts


def episode_stats(
    played: Sequence[EpisodeResult], dropped: int, groups_failed: int
) -> EpisodeStats:
    """The cycle's episode record: per episode and per turn of every draw."""
    turn_counts = [len(episode.turns) for episode in played]
    records: dict[tuple[int, int], TurnRecord] = {}
    for episode in played:
        for number, (turn, observed) in enumerate(
            zip(episode.turns, observation_tokens(episode.turns), strict=True)
        ):
            key = (episode.draw, number)
            record = records.setdefault(
                key,
                TurnRecord(
                    draw=episode.draw,
                    turn=number,
                    seq_ids=[turn.seq_id, turn.seq_id],
                    episodes=0,
                    action_tokens=0,
                    observation_tokens=0,
                    cut=0,
                ),
            )
            record.seq_ids = [
                min(record.seq_ids[0], turn.seq_id),
                max(record.seq_ids[1], turn.seq_id),
            ]
            record.episodes += 1
            record.action_tokens += len(turn.action)
            record.observation_tokens += observed
            record.cut += turn.stop_reason == "length"
    turn_records = [records[key] for key in sorted(records)]
    return EpisodeStats(
        episodes=len(played),
        turns_per_episode=statistics.fmean(turn_counts) if turn_counts else 0.0,
        turns=dict(sorted(Counter(turn_counts).items())),
        action_tokens=sum(record.action_tokens for record in turn_records),
        observation_tokens=sum(record.observation_tokens for record in turn_records),
        stop_reasons=dict(sorted(Counter(str(episode.stop) for episode in played).items())),
        failed=sum(episode.stop == FAILED for episode in played),
        retried=sum(episode.spec.attempt > 0 for episode in played),
        dropped=dropped,
        groups_failed=groups_failed,
        turn_records=turn_records,
    )
