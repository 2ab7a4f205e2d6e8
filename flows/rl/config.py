"""The RL flow's configuration: `RLConfig`, its loss choice and the critic and reference
KL settings (no Prefect: the UI form and the CLI read it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from flows.core.config import BudgetField, FlowConfig, MaxStalenessField, PricesField
from flows.core.evaluation.config import EvalSettings
from flows.core.fields import (
    EveryCycles,
    LearningRate,
    MaxSequenceTokens,
    MaxTokens,
    NonEmpty,
    PromptsPerCycle,
    Settings,
    Temperature,
)
from flows.rl.judge_config import JudgeSettings
from whitney.losses import LOSS_FUNCTIONS

LossName = Literal[LOSS_FUNCTIONS]  # type: ignore[valid-type]
"""Whitney's eight loss functions (whitney.losses.LOSS_FUNCTIONS), as a UI dropdown."""


class CriticSettings(Settings):
    """The critic of PPO with a critic (`loss = "ppo_critic"`); unused by other losses."""

    gamma: float = Field(default=1.0, ge=0, le=1, description="GAE discount per token")
    gae_lambda: float = Field(default=0.95, ge=0, le=1, description="GAE lambda")
    learning_rate: LearningRate = Field(
        default=3e-4, description="AdamW learning rate of the critic run"
    )
    grad_clip_norm: float = Field(
        default=1.0, ge=0, description="Clip the critic's gradient norm to this (0: off)"
    )
    normalize_advantages: bool = Field(
        default=True,
        description="Whiten the GAE advantages over each group's completion tokens",
    )


class ReferenceKLSettings(Settings):
    """REINFORCE++'s KL penalty against a frozen reference run."""

    enabled: bool = Field(
        default=False,
        description="Create a frozen reference run and put its per-token KL in the advantages",
    )
    kl_coef: float = Field(default=0.05, ge=0, le=100, description="Weight of the KL penalty")
    length_normalize: bool = Field(
        default=False, description="Divide each sequence's advantage by its length first"
    )


class RolloutSettings(Settings):
    """Episodes of a multi-turn environment: their limits, and what a failed one does."""

    max_turns: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Most turns of an episode: one still going after them is cut (stop reason "
        "max_turns)",
    )
    max_episode_tokens: MaxSequenceTokens = Field(
        default=1024,
        description="Most tokens of an episode's transcript (observations and actions): a "
        "turn samples at most the room left (and at most max_tokens), an episode with no room "
        "left is cut (episode_tokens)",
    )
    episode_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="Cut an episode whose wall time since its start passed this, before its "
        "next turn (time); empty: no limit. The one limit that reads the clock, so a retried "
        "cycle may cut other episodes",
    )
    limit_reward: float | None = Field(
        default=None,
        ge=-1e6,
        le=1e6,
        description="The reward of an episode a limit cut: empty: what its steps earned until "
        "then; a number: that reward instead",
    )
    failure_policy: Literal["fail_fast", "retry_episode", "min_viable_group"] = Field(
        default="fail_fast",
        description="An episode whose environment call failed for good: fail_fast fails the "
        "cycle (Prefect retries it, replaying); retry_episode runs it again from its start, "
        "up to episode_retries times, then fails the cycle; min_viable_group leaves it out and "
        "keeps its group if at least min_viable_share of the group succeeded, else drops the "
        "group (the cycle fails if no group is left)",
    )
    episode_retries: int = Field(
        default=2, ge=1, le=16, description="retry_episode: new attempts of a failed episode"
    )
    min_viable_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="min_viable_group: the share of a group's episodes that must succeed (at "
        "least 2) for the group to be trained on",
    )


class RLConfig(FlowConfig):
    """The RL flow: group sampling, rewards from an environment, group-relative advantages,
    a build_loss recipe, forward_backward and optim_step, once per cycle."""

    env: NonEmpty = Field(
        default="digits",
        description="Environment: a built-in name (arithmetic, digits, lowercase; quiz: "
        "multi-turn) or an import path module:attr",
    )
    loss: LossName = Field(
        default="importance_sampling",
        description="Loss function; its build_loss recipe comes from flows.rl.recipes "
        "(ppo_critic: PPO with a critic run, ppo on the policy)",
    )
    recipe: str = Field(
        default="",
        description="A build_loss recipe of your own by import path module:attr (a "
        "flows.rl.recipes.Recipe whose loss_function is `loss`); empty: the built-in recipe "
        "of `loss`",
    )
    loss_config: dict[str, float] = Field(
        default_factory=dict,
        description="The loss's settings by Whitney's key names (clip_low_threshold, "
        "clip_high_threshold, beta, delta_low, delta_high, value_clip); the recipe sends "
        "them as the provider wants: clip bounds per token on tinker, scalar keys elsewhere",
    )
    critic: CriticSettings = Field(
        default_factory=CriticSettings,
        description="PPO with a critic (loss ppo_critic): GAE and the critic run's training",
    )
    reference_kl: ReferenceKLSettings = Field(
        default_factory=ReferenceKLSettings,
        description="REINFORCE++: a frozen reference run's per-token KL in the advantages",
    )
    resample_rounds: int = Field(
        default=0,
        ge=0,
        le=16,
        description="Dynamic resampling: a group whose rewards are all equal (all-zero "
        "advantages) is sampled again, with a fresh seed, up to this many times, then "
        "dropped from the loss; 0: off (such groups are trained on as they are)",
    )
    advantages: Literal["grpo", "grpo_no_std", "rloo"] = Field(
        default="grpo",
        description="grpo: reward minus group mean, over group std; grpo_no_std: without the "
        "std; rloo: leave-one-out baseline",
    )
    prompts_per_cycle: PromptsPerCycle = Field(default=8, description="Groups per cycle")
    group_size: int = Field(default=8, ge=2, le=256, description="Samples per prompt")
    max_tokens: MaxTokens = Field(
        default=12,
        description="Most tokens per completion (per turn, in a multi-turn environment)",
    )
    temperature: Temperature = Field(default=1.0, description="Sampling temperature")
    concurrent_sampling: bool = Field(
        default=True,
        description="Submit a cycle's sample requests together (a reserved block of seq ids)",
    )
    pipelined: bool = Field(
        default=True,
        description="Submit forward_backward, optim_step and the save_weights_for_sampler "
        "that publishes the next cycle's sampler (named cycle-{n+1}) back to back, without "
        "waiting in between; the same training as one call after another",
    )
    max_staleness: MaxStalenessField
    proximal_clip: bool = Field(
        default=True,
        description="Off-policy (staleness > 0), a clipped loss (ppo, gspo, dppo, dro) clips "
        "around the current weights and weighs each token by its truncated importance weight "
        "(decoupled PPO); false: around the sampler's weights",
    )
    eval_every: EveryCycles = Field(
        default=0,
        description="Evaluate the weights after every this many cycles and after the last, on "
        "a sampler of their own: the environment's held-out prompts, greedily and group_size "
        "times at the temperature (eval.reward_mean, eval.pass_at_k); 0: never. Training is "
        "the same either way",
    )
    eval_at_start: bool = Field(
        default=False,
        description="Also evaluate the weights before the first cycle trains (the base model "
        "on a fresh run), as eval_every does after a cycle: the first cycle's eval_before",
    )
    rollout: RolloutSettings = Field(
        default_factory=RolloutSettings,
        description="Multi-turn environments: turn, token and time limits of an episode, and "
        "the failure policy; unused by single-turn environments",
    )
    judge: JudgeSettings = Field(
        default_factory=JudgeSettings,
        description="Judged rewards (docs/judge.md): a judge model on a frozen run grades each "
        "completion (or each group) by a rubric, instead of the environment's reward; the "
        "environment still gives the prompts and the evaluation's reward",
    )
    budget: BudgetField
    prices: PricesField

    def served_models(self) -> dict[str, str]:
        """The policy's base model, and the judge's when there is one."""
        served = super().served_models()
        if self.judge.model is not None:
            served["judge.model"] = self.judge.model
        return served

    def eval_settings(self) -> EvalSettings:
        """The environment's held-out prompts, k = group_size samples at the temperature."""
        return self.evaluation(
            env=self.env,
            group_size=self.group_size,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
        )
