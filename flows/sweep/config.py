"""The sweep flow's configuration: a pydantic model whose field descriptions and bounds are the
Prefect UI's run form. No Prefect: the CLI and the plan read it too.

A sweep trains one kind of flow (`kind`: a training flow of flows.catalogue) many times, each
trial the shared `base` settings plus the trial's own values of the swept fields (dotted
paths into the trial's config: `learning_rate`, `lora_rank`, `loss_config.clip_low`), from a
grid or drawn at random with `seed`. The trials run in `rungs` of cycles; after each rung but
the last, the `keep` share of them with the best `metric` continue.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flows.catalogue import COMMANDS
from flows.core.fields import NonEmpty, Seed
from flows.core.loop.cost import PriceTable


class RandomRange(BaseModel):
    """How a random search draws one field: one of `values`, or a number in [low, high]
    (uniform, or log-uniform with `log`; an integer with `integer`)."""

    model_config = ConfigDict(extra="forbid")

    values: list[Any] | None = Field(default=None, min_length=1, description="Draw one of these")
    low: float | None = Field(default=None, description="Least value drawn (with high)")
    high: float | None = Field(default=None, description="Greatest value drawn (with low)")
    log: bool = Field(default=False, description="Uniform in log space (low > 0)")
    integer: bool = Field(default=False, description="Round the draw to an integer")

    @model_validator(mode="after")
    def _values_or_a_range(self) -> RandomRange:
        ranged = self.low is not None and self.high is not None
        if (self.values is None) == (not ranged):
            raise ValueError("give values, or both low and high")
        if ranged and self.low > self.high:  # type: ignore[operator]
            raise ValueError("low is above high")
        if ranged and self.log and self.low <= 0:  # type: ignore[operator]
            raise ValueError("log needs low > 0")
        return self


class SweepConfig(BaseModel):
    """A search over the fields of a training flow's config: its trials are flow runs of that
    flow's deployment, at most `max_concurrent` at once, halved at each rung on `metric`."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(
        default="rl",
        description=f"The training flow each trial runs: {', '.join(COMMANDS)} "
        "(flows.catalogue); each trial is a flow run of its deployment",
    )
    deployment: str | None = Field(
        default=None,
        pattern=r"^[^/]+/[^/]+$",
        description="The trials' deployment as flow/deployment; empty: the kind's own "
        "(rl/rl-on-demand, sft/sft-nightly, ...)",
    )
    base: dict[str, Any] = Field(
        default_factory=dict,
        description="Settings of the trial config every trial shares (its cycle count and "
        "resume_from are the sweep's)",
    )
    search: Literal["grid", "random"] = Field(
        default="grid",
        description="grid: every combination of the grid's values; random: `samples` trials "
        "drawn from `random` with `seed`",
    )
    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Dotted field path -> the values to try (search = grid)",
    )
    random: dict[str, RandomRange] = Field(
        default_factory=dict,
        description="Dotted field path -> how to draw it (search = random)",
    )
    samples: int = Field(default=6, ge=1, le=1000, description="Trials of a random search")
    seed: Seed = Field(default=0, description="Seed of a random search's draws")
    metric: NonEmpty = Field(
        default="reward_mean",
        description="The cycle metric the rungs rank on (a column of the cycle table: "
        "reward_mean, eval.reward_mean, eval_loss, ...): its last value in the rung",
    )
    mode: Literal["max", "min"] = Field(
        default="max", description="Whether the best trial has the most or the least metric"
    )
    rungs: list[int] = Field(
        default_factory=lambda: [10, 30],
        min_length=1,
        description="Cycles each surviving trial has trained after each rung, increasing; "
        "the last is the full length. Survivors continue from their rung's final checkpoint",
    )
    keep: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Share of the trials a rung keeps (rounded up, at least one): the best "
        "by metric; the others stop there",
    )
    max_concurrent: int = Field(
        default=2, ge=1, le=1000, description="Most trials running at once (over every worker)"
    )
    concurrency_limit: NonEmpty = Field(
        default="whitney-sweep",
        description="The Prefect global concurrency limit the trials hold a slot of, set to "
        "max_concurrent when the sweep starts (sweeps sharing its name share the slots)",
    )
    max_cost: float | None = Field(
        default=None,
        gt=0,
        description="USD over every trial: no trial or rung starts that would bring the "
        "estimated cost above it; needs a price table",
    )
    prices: PriceTable | None = Field(
        default=None,
        description="USD per million sampled / prefilled / trained tokens, for the trials' "
        "cost; empty: the credentials block's price table, if any",
    )
    trial_timeout_s: float = Field(
        default=86_400,
        gt=0,
        description="A trial's rung still running after this long is cancelled",
    )
    promote: bool = Field(
        default=False,
        description="Hand the best trial's checkpoint to the promote-checkpoint deployment "
        "(it pauses for a person's approval)",
    )
    promote_target_dir: NonEmpty = Field(
        default="promoted",
        description="promote-checkpoint's target_dir on its worker, with promote",
    )
