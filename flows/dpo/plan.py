"""A DPO flow's pairs and cycle plan, resolved from its config and checked before anything is
allocated (no Prefect, no torch), and the datums its calls send.

Which pairs cycle n trains on is a pure function of (seed, n): a stream of the training pairs,
shuffled per epoch, `pairs_per_cycle` a cycle, so a replayed or resumed cycle sends
byte-identical payloads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flows.core.config import ConfigError, check_resume_from
from flows.core.environments.rendering import config_renderer
from flows.core.loop.plans import once_per_process
from flows.dpo.config import DPOConfig
from flows.dpo.objective import pair_advantages
from flows.dpo.pairs import SPLIT_SALT, PairTokens, read_pairs, render_pair
from flows.sft.plan import epoch_order, split_held_out
from whitney.datums import Datum, rl_datum, sft_datum
from whitney.losses import PROVIDER_LOSS_SUPPORT, require_advertised_loss

LOSS_FUNCTION = "importance_sampling"
FORWARD_LOSS = "cross_entropy"
"""The loss of the policy's `forward` calls: only their per-token logprobs are read."""


@dataclass(frozen=True)
class DPOPlan:
    """The rendered pairs of a DPO config, split, and which of them each cycle trains on."""

    config: DPOConfig
    train: tuple[PairTokens, ...]
    eval: tuple[PairTokens, ...]
    source: str

    def batch(self, cycle: int) -> list[int]:
        """Indices into `train` of cycle `cycle`'s pairs."""
        count = len(self.train)
        first = cycle * self.config.pairs_per_cycle
        indices = []
        for position in range(first, first + self.config.pairs_per_cycle):
            epoch, index = divmod(position, count)
            indices.append(epoch_order(self.config.seed, epoch, count)[index])
        return indices

    def eval_due(self, cycles_done: int) -> bool:
        """Whether the held-out pairs are evaluated after `cycles_done` cycles (0: before)."""
        every = self.config.eval_every
        if not self.eval or every == 0:
            return False
        return cycles_done % every == 0 or cycles_done == self.config.cycles

    def eval_chunks(self) -> list[list[PairTokens]]:
        """The held-out pairs, `chunk_size` per forward call."""
        size = self.config.chunk_size
        return [list(self.eval[i : i + size]) for i in range(0, len(self.eval), size)]


def forward_datums(pairs: Sequence[PairTokens]) -> list[Datum]:
    """cross_entropy datums of the chosen then the rejected answer of each pair, in order:
    their `forward` outputs are the policy's logprobs of each answer's tokens."""
    return [
        sft_datum(list(pair.prompt), list(answer))
        for pair in pairs
        for answer in (pair.chosen, pair.rejected)
    ]


def answer_logprobs(
    outputs: Sequence[dict[str, list[float]]], datums: Sequence[Datum]
) -> list[list[float]]:
    """The logprobs of each datum's answer tokens (its positions of weight 1), from `forward`
    outputs."""
    if len(outputs) != len(datums):
        raise ValueError(f"forward answered {len(outputs)} outputs for {len(datums)} datums")
    rows = []
    for output, datum in zip(outputs, datums, strict=True):
        weights = datum["loss_inputs"]["weights"]["values"]
        rows.append([lp for lp, w in zip(output["logprobs"], weights, strict=True) if w > 0])
    return rows


def training_datums(
    config: DPOConfig,
    pairs: Sequence[PairTokens],
    logprobs: Sequence[list[float]],
    margins: Sequence[float],
) -> list[Datum]:
    """The importance_sampling datums of a batch: each answer with its `forward` logprobs
    as the sampling logprobs (ratio 1) and the DPO advantages (flows.dpo.objective)."""
    data = []
    for index, (pair, pair_margin) in enumerate(zip(pairs, margins, strict=True)):
        chosen, rejected = pair_advantages(
            pair_margin,
            len(pair.chosen),
            len(pair.rejected),
            beta=config.beta,
            label_smoothing=config.label_smoothing,
            sft_weight=config.sft_weight,
            pairs=len(pairs),
        )
        prompt = list(pair.prompt)
        data.append(rl_datum(prompt, list(pair.chosen), logprobs[2 * index], chosen))
        data.append(rl_datum(prompt, list(pair.rejected), logprobs[2 * index + 1], rejected))
    return data


def load_dpo_plan(config: DPOConfig) -> DPOPlan:
    """The rendered, split pairs of a config; ConfigError naming the field (and line)."""
    renderer = config_renderer(config)
    pairs = read_pairs(config.data_path)
    source = config.data_path
    tokens = [
        render_pair(renderer, pair, f"{source} line {pair.line}", config.max_pair_tokens)
        for pair in pairs
    ]
    train, held = split_held_out(pairs, tokens, config.eval_fraction, source, "pair", SPLIT_SALT)
    return DPOPlan(config, train, held, source)


@once_per_process
def check_dpo_config(config: DPOConfig) -> DPOPlan:
    """The plan of a config the provider will accept, checked before anything is allocated;
    ConfigError naming the field (for data: the file and line) otherwise."""
    for loss in (LOSS_FUNCTION, FORWARD_LOSS):
        try:
            require_advertised_loss(config.provider, loss, PROVIDER_LOSS_SUPPORT)
        except ValueError as error:
            raise ConfigError("provider", str(error)) from None
    plan = load_dpo_plan(config)
    check_resume_from(config.resume_from, config.cycles)
    return plan
