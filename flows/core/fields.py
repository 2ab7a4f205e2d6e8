"""The field types the flow configs share: each concept's type, bounds and (where its meaning
is the same in every config) description, declared once; a config gives its own default, and
its own description where the setting means more there. No Prefect, no torch."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Settings(BaseModel):
    """A group of settings nested in a config (a table in TOML): frozen, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


NonEmpty = Annotated[str, Field(min_length=1)]
"""A name or text setting; `NonEmpty | None` is left empty (None) or set, never to ""."""
LearningRate = Annotated[float, Field(gt=0, le=1, description="AdamW learning rate")]
"""An AdamW learning rate (the policy's of every training flow, the critic's)."""
Seed = Annotated[int, Field(ge=0, le=2**31 - 1)]
"""A seed (of a run, of evaluation requests, of a random search's draws)."""
LoraRank = Annotated[int, Field(ge=1, le=256)]
"""A run's LoRA rank (the trained adapter's, a distillation teacher's)."""
GroupSize = Annotated[int, Field(ge=1, le=256)]
"""Samples of one prompt (a group): RL's, distillation's student's, an evaluation's k."""
MaxTokens = Annotated[int, Field(ge=1, le=8192, description="Most tokens per completion")]
"""Most tokens of a sampled completion (RL's, distillation's, an evaluation's)."""
Temperature = Annotated[float, Field(gt=0, le=10)]
"""A sampling temperature of training's samples (RL's, an evaluation's k samples)."""
EveryCycles = Annotated[int, Field(ge=0, le=100_000)]
"""Something done after every this many cycles (an evaluation, a checkpoint); 0: never."""
MaxSequenceTokens = Annotated[int, Field(ge=2, le=1_000_000)]
"""Most tokens of one sequence a flow trains on or plays (an SFT example, a DPO pair's prompt
and answer, an episode's transcript)."""
HeldOutShare = Annotated[float, Field(ge=0, le=0.5)]
"""The share of a data set held out for evaluation (0: none)."""
PromptsPerCycle = Annotated[int, Field(ge=1, le=1024)]
"""Prompts a cycle trains on (RL's groups, distillation's prompts, DPO's pairs)."""
