"""The SFT flow's configuration: a pydantic model whose field descriptions and bounds are the
Prefect UI's run form (as `RLConfig` is for the RL flow).

An SFT run is sized by `steps` (optimizer steps, `steps_per_cycle` per cycle subflow) or by
`epochs` (passes over the training split, one cycle subflow per epoch), not by `cycles`: the
shared `cycles` field is hidden from the form and refused when given. `checkpoint_every` and
`resume_from` are the shared ones: they count cycles and name checkpoints `cycle-{n}`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from flows.core.config import CheckpointEvery, FlowConfig
from flows.core.evaluation.config import CORPUS, EvalSettings
from flows.core.fields import HeldOutShare, LearningRate, MaxSequenceTokens
from flows.sft.schedules import ScheduleName

EvalFraction = Annotated[
    HeldOutShare,
    Field(
        description="Share of the examples held out for the eval loss (0: no eval); the split "
        "depends on the examples' text only, not on the seed, so SFT and a distillation on the "
        "same data hold out the same examples",
    ),
]
"""The `eval_fraction` of the flows that read (prompt, completion) examples."""

DEFAULT_STEPS = 60
EVAL_MAX_TOKENS = 64
"""Most tokens of a sampled completion when an SFT checkpoint is evaluated."""


class SFTConfig(FlowConfig):
    """Supervised fine-tuning: (prompt, completion) pairs or conversations, rendered by
    `renderer`, cross_entropy on the completion (assistant) tokens, batches of `batch_size`, a
    learning-rate schedule, eval loss on a held-out split."""

    data_path: str | None = Field(
        default=None,
        description='JSONL file, one example per line: {"prompt": str, "completion": str}, '
        'or a conversation {"messages": [{"role": ..., "content": ...}, ...]} (trained on its '
        "assistant turns); empty: the built-in corpus (312 Q/A pairs about 24 animals)",
    )
    steps: int = Field(
        default=DEFAULT_STEPS, ge=1, le=10_000_000, description="Optimizer steps in total"
    )
    epochs: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="If set: passes over the training split instead of `steps`, one cycle "
        "subflow per epoch",
    )
    steps_per_cycle: int = Field(
        default=10,
        ge=1,
        le=100_000,
        description="Optimizer steps per cycle subflow (not with epochs)",
    )
    batch_size: int = Field(default=16, ge=1, le=4096, description="Examples per optimizer step")
    pipelined: bool = Field(
        default=False,
        description="Submit each step's forward_backward and optim_step back to back, without "
        "waiting in between; the same seq ids and the same training as one call after another",
    )
    learning_rate: LearningRate = Field(
        default=3e-3, description="AdamW peak learning rate (after warmup)"
    )
    schedule: ScheduleName = Field(
        default="cosine",
        description="Learning-rate decay after warmup: constant, linear (to 0) or cosine (to 0)",
    )
    warmup_steps: int = Field(
        default=5, ge=0, le=10_000_000, description="Steps of linear warmup up to learning_rate"
    )
    eval_fraction: EvalFraction = 0.1
    eval_every: int = Field(
        default=10,
        ge=1,
        le=10_000_000,
        description="Eval loss (forward on the held-out split) every this many steps, "
        "before the first step and after the last",
    )
    max_example_tokens: MaxSequenceTokens = Field(
        default=1024,
        description="Refuse (before allocation) an example longer than this many tokens",
    )
    checkpoint_every: CheckpointEvery = 3
    cycles: SkipJsonSchema[int | None] = Field(
        default=None,
        exclude=True,
        description="Not used by SFT: size it with steps (and steps_per_cycle) or epochs",
    )

    def eval_settings(self) -> EvalSettings | None:
        """The held-out split of the data (none with eval_fraction 0): its eval loss, and its
        prompts sampled 4 times each, rewarded by similarity to their reference completion."""
        if self.eval_fraction == 0:
            return None
        return self.evaluation(
            env=None,
            data=self.data_path or CORPUS,
            eval_fraction=self.eval_fraction,
            group_size=4,
            max_tokens=EVAL_MAX_TOKENS,
        )

    @field_validator("cycles")
    @classmethod
    def _sized_by_steps_or_epochs(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError(
                "SFT is sized by steps (steps_per_cycle per cycle) or epochs (one cycle "
                "each), not by cycles"
            )
        return value
