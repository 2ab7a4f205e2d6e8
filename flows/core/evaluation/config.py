"""What an evaluation samples and scores (no Prefect: the UI forms and the CLI read it).

`EvalSettings` names the eval set (an environment's held-out prompts, and/or the held-out
split of SFT data), how it is rendered (training's tokenizer and renderer on the checkpoint's
base model) and how it is sampled: each prompt once greedily (`top_k: 1`) and
`group_size` times at `temperature`, every request seeded from (`seed`, EVAL_CYCLE, prompt
index). The training flows derive theirs from their config (`FlowConfig.eval_settings`), and
put it in every `whitney.checkpoint.saved` event, so an evaluation off the critical path
samples exactly what the inline one does.
"""

from __future__ import annotations

from typing import ClassVar, Self

from pydantic import ConfigDict, Field, model_validator

from flows.core.fields import GroupSize, MaxTokens, NonEmpty, Seed, Temperature
from flows.core.renames import RenamedFields
from whitney.renderers import RendererName

CORPUS = "corpus"
"""`data` naming the built-in SFT corpus."""


class EvalSettings(RenamedFields):
    """An eval set and its sampling: the same settings give the same requests."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    RENAMED: ClassVar[dict[str, str]] = {"samples": "group_size"}

    env: NonEmpty | None = Field(
        default="digits",
        description="Environment whose held-out prompts are sampled and rewarded: a built-in "
        "name (arithmetic, digits, lowercase) or an import path module:attr; empty: the "
        "held-out pairs of `data`, rewarded by their similarity to the reference completion",
    )
    data: NonEmpty | None = Field(
        default=None,
        description="SFT data whose held-out split gives the eval loss per token: corpus "
        "(the built-in corpus) or a JSONL file of {prompt, completion}; empty: no eval loss",
    )
    eval_fraction: float = Field(
        default=0.1,
        gt=0,
        le=0.5,
        description="Share of `data` held out (the SFT flow's split of the same data)",
    )
    tokenizer: NonEmpty | None = Field(
        default=None,
        description="The tokenizer training used: a Hugging Face repo id or a local directory; "
        "empty: the base model's own",
    )
    renderer: RendererName = Field(
        default="auto",
        description="The renderer training used (raw, chat_template, llama3, qwen; auto: raw "
        "for local/*, else the chat template if the tokenizer has one): prompts are rendered "
        "and completions parsed as in training",
    )
    prompts: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Held-out prompts drawn from an environment that has no eval_prompts() "
        "of its own (the built-ins have)",
    )
    group_size: GroupSize = Field(
        default=8,
        description="k: samples per prompt at `temperature` (a group), for the sampled reward "
        "and pass@k (formerly samples)",
    )
    max_tokens: MaxTokens = 12
    temperature: Temperature = Field(
        default=1.0, description="Temperature of the k samples (training's)"
    )
    seed: Seed = Field(default=0, description="Seed of the eval requests")
    pass_reward: float = Field(
        default=1.0,
        description="A sample passes (pass@k) when its reward is at least this (1.0: an "
        "exact answer, for the built-in environments and the reference similarity)",
    )

    @model_validator(mode="after")
    def _something_to_evaluate(self) -> Self:
        if self.env is None and self.data is None:
            raise ValueError("env and data are both empty: name an environment or SFT data")
        return self
