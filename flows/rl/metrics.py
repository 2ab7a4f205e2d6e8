"""The numbers a cycle reports, and what a whole RL flow returns."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from flows.core.evaluation.plan import EvalMetrics
from flows.core.loop.cycles import CycleResult
from flows.core.loop.off_policy_schedule import (
    KlSampleTrainField,
    PresampledField,
    StalenessField,
)
from flows.core.loop.training import TrainingResult
from flows.core.records.plots import Line, Panel


class TurnRecord(BaseModel):
    """One turn of a multi-turn cycle: the block of `sample` operations it took."""

    draw: int = Field(description="The rollout: 0 first, then retried episodes and resampling")
    turn: int
    seq_ids: list[int] = Field(description="First and last seq id of the turn's samples")
    episodes: int = Field(description="Episodes that sampled an action")
    action_tokens: int = Field(description="Tokens sampled")
    observation_tokens: int = Field(
        description="Tokens of the observations the turn's prompts end with (the first "
        "turn: the initial observations)"
    )
    cut: int = Field(description="Actions that hit max_tokens (stop reason length)")


class EpisodeStats(BaseModel):
    """The episodes of a multi-turn cycle: turns, tokens, why they ended, failures."""

    episodes: int = Field(description="Episodes played, every draw and attempt counted")
    turns_per_episode: float = Field(description="Mean turns of the episodes played")
    turns: dict[int, int] = Field(description="Episodes played by number of turns")
    action_tokens: int = Field(description="Tokens the policy sampled")
    observation_tokens: int = Field(
        description="Tokens between the actions: the observations as the renderer wrote them "
        "(BOS, an end-of-turn token closing a cut action and chat markup included)"
    )
    stop_reasons: dict[str, int] = Field(
        description="Episodes by why they ended: done, max_turns, episode_tokens, time, failed"
    )
    failed: int = Field(description="Episodes whose environment call failed for good")
    retried: int = Field(description="Episodes played again after a failure (retry_episode)")
    dropped: int = Field(
        description="Episodes left out of the loss: failed (min_viable_group), or of a group "
        "dropped for too few successes"
    )
    groups_failed: int = Field(description="Groups dropped for too few successful episodes")
    turn_records: list[TurnRecord] = Field(description="Every turn's block of samples")

    def markdown(self) -> str:
        """The cycle artifact's `Turns` section: the episodes, then a row per turn."""
        stops = ", ".join(f"{reason} {count}" for reason, count in self.stop_reasons.items())
        lines = [
            "## Turns",
            "",
            f"{self.episodes} episodes, {self.turns_per_episode:.2f} turns each "
            f"({', '.join(f'{turns}: {count}' for turns, count in self.turns.items())}); "
            f"{self.action_tokens:,} action and {self.observation_tokens:,} observation "
            f"tokens; ended: {stops}; failed {self.failed}, retried {self.retried}, "
            f"dropped {self.dropped} (groups {self.groups_failed})",
            "",
            "| draw | turn | seq | episodes | action tokens | observation tokens | cut |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {r.draw} | {r.turn} | {r.seq_ids[0]}–{r.seq_ids[1]} | {r.episodes} | "
            f"{r.action_tokens:,} | {r.observation_tokens:,} | {r.cut} |"
            for r in self.turn_records
        ]
        return "\n".join(lines)


class CycleMetrics(CycleResult):
    """What a cycle subflow returns (with `seq_end`, where the next cycle starts), and its
    record: a row of the cycle's artifact and a metrics JSON line."""

    reward_mean: float
    reward_std: float
    all_zero_group_share: float = Field(
        description="Share of groups with uniform reward: all-zero advantages, no signal"
    )
    groups_resampled: int = Field(
        default=0, description="Groups sampled again for having uniform reward (resampling)"
    )
    groups_dropped: int = Field(
        default=0,
        description="Groups left out of the loss: still uniform after resampling, or (multi-turn "
        "min_viable_group) with too few successful episodes",
    )
    recipe_metrics: dict[str, float] = Field(
        default_factory=dict,
        description="The recipe's own numbers: value_loss, values_clipfrac, critic_grad_norm "
        "(PPO with a critic); reference_kl (REINFORCE++: mean sampled minus reference logprob)",
    )
    auxiliary_seq_end: dict[str, int] = Field(
        default_factory=dict,
        description="Seq id the next cycle starts at on each auxiliary run (critic, reference)",
    )
    sampler_id: str = Field(default="", description="The sampler the cycle's groups came from")
    staleness: StalenessField
    presampled: PresampledField
    loss: float
    grad_norm: float
    kl_sample_train: KlSampleTrainField
    tokens_sampled: int
    tokens_trained: int
    usage: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="Billed usage counters per operation kind"
    )
    cost: float | None = Field(default=None, description="Estimated USD, with a price table")
    episodes: EpisodeStats | None = Field(
        default=None, description="A multi-turn environment's episodes and turns"
    )
    checkpoint: str | None = Field(
        default=None, description="The cycle-{n} checkpoint saved after the cycle, if one was"
    )
    eval: EvalMetrics | None = Field(
        default=None, description="The inline evaluation of the weights after the cycle"
    )
    eval_before: EvalMetrics | None = Field(
        default=None,
        description="The inline evaluation of the weights before the cycle trained (the "
        "first cycle, with eval_at_start)",
    )

    def sections(self) -> list[str]:
        """A multi-turn cycle's turns, in its artifact."""
        return [self.episodes.markdown()] if self.episodes is not None else []


class RLResult(TrainingResult):
    """What `rl_flow` returns: where the trained weights are, and every cycle's metrics."""

    cycles: list[CycleMetrics]
    usage: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="Billed usage per operation kind of the flow run"
    )
    cost: float | None = Field(default=None, description="Estimated USD, with a price table")
    budget_stop: str | None = Field(
        default=None, description="Why the flow stopped before its last cycle, if it did"
    )


def learning_curves(cycles: Sequence[CycleMetrics]) -> list[Panel]:
    """The RL summary's picture: reward and loss by cycle, and the inline evaluations (the
    one before cycle n's training at n - 1, as after cycle n - 1)."""
    evaluated = [(c.cycle - 1, c.eval_before) for c in cycles if c.eval_before is not None]
    evaluated += [(cycle.cycle, cycle.eval) for cycle in cycles if cycle.eval is not None]
    panels = [
        Panel("reward", "cycle", [Line("reward_mean", [(c.cycle, c.reward_mean) for c in cycles])]),
        Panel("loss", "cycle", [Line("loss", [(c.cycle, c.loss) for c in cycles])]),
    ]
    if evaluated:
        lines = [
            Line(f"eval.{name}", [(n, getattr(e, name)) for n, e in evaluated])
            for name in ("reward_mean", "sampled_reward_mean", "pass_at_k")
        ]
        panels.insert(1, Panel("eval (held-out prompts)", "cycle", lines))
    return panels
