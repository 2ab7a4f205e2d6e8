"""The DPO flow's configuration: a pydantic model whose field descriptions and bounds are the
Prefect UI's run form (as `SFTConfig` is for the SFT flow). No Prefect, no torch."""

from __future__ import annotations

from pydantic import Field

from flows.core.config import BudgetField, CheckpointEvery, FlowConfig, PricesField
from flows.core.fields import (
    EveryCycles,
    HeldOutShare,
    LearningRate,
    MaxSequenceTokens,
    NonEmpty,
    PromptsPerCycle,
)
from whitney.uris import CHECKPOINT_PATTERN

BASE_REFERENCE = "base"
REFERENCE_PATTERN = f"^base$|{CHECKPOINT_PATTERN}"


class DPOConfig(FlowConfig):
    """Direct preference optimisation: (prompt, chosen, rejected) pairs rendered by
    `renderer`, a frozen reference run's logprobs once per pair, then per cycle the policy's
    `forward` logprobs of a batch, the DPO weights, and one `forward_backward` with
    `importance_sampling` datums (ratio 1: the DPO gradient) and `optim_step`."""

    data_path: NonEmpty = Field(
        description='JSONL file, one pair per line: {"prompt": str, "chosen": str, "rejected": '
        'str}, or {"messages": [...], "chosen": str, "rejected": str} (the conversation '
        "before the two candidate assistant turns)",
    )
    reference: str = Field(
        default=BASE_REFERENCE,
        pattern=REFERENCE_PATTERN,
        description="The frozen reference: base (the base model; the policy starts from it) "
        "or a checkpoint whitney://runs/<run>/states/<name> (e.g. an SFT flow's final one; the "
        "policy starts from it too)",
    )
    beta: float = Field(
        default=0.1,
        gt=0,
        le=100,
        description="DPO temperature: margin = beta * (policy - reference logprob, chosen "
        "minus rejected)",
    )
    label_smoothing: float = Field(
        default=0.0,
        ge=0,
        lt=0.5,
        description="Share of the pairs assumed mislabelled (conservative DPO); 0: plain DPO",
    )
    sft_weight: float = Field(
        default=0.0,
        ge=0,
        le=100,
        description="Weight of an SFT term on the chosen answers (their mean NLL per token) "
        "added to the DPO loss; 0: none",
    )
    pairs_per_cycle: PromptsPerCycle = Field(
        default=8, description="Pairs per optimizer step (one step a cycle)"
    )
    learning_rate: LearningRate = 1e-3
    eval_fraction: HeldOutShare = Field(
        default=0.2,
        description="Share of the pairs held out for the preference accuracy (0: no eval); "
        "the split depends on the pairs' text only, not on the seed",
    )
    eval_every: EveryCycles = Field(
        default=1,
        description="Evaluate the held-out pairs (preference accuracy: the share whose margin "
        "is positive, and the DPO loss) before the first cycle, after every this many cycles "
        "and after the last; 0: never",
    )
    max_pair_tokens: MaxSequenceTokens = Field(
        default=1024,
        description="Refuse (before allocation) a prompt plus answer longer than this many tokens",
    )
    chunk_size: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="Pairs per reference logprobs call and per evaluation forward call",
    )
    checkpoint_every: CheckpointEvery = 10
    budget: BudgetField
    prices: PricesField
