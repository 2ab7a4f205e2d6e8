"""An SFT flow's data and step plan, resolved from its config and checked before anything is
allocated.

`load_sft_plan(config)` reads the examples (`config.data_path`, or the built-in corpus of
`flows.sft.corpus`): (prompt, completion) pairs and conversations. The config's renderer
(`flows.core.environments.rendering`) turns each into tokens and the mask of its assistant turns,
one
cross_entropy datum each (with the raw renderer a pair is BOS + prompt, completion + EOS: the
`sft_datum` of Whitney's Loop building blocks). It holds out the eval split, and fixes which
examples every optimizer step trains on: a pure function of (seed, step),
so a replayed or resumed cycle sends byte-identical payloads. `check_sft_config` is the
fail-closed step the flow and the CLI run first (exit 2 naming the field, and the line of a bad
example).
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from flows.core.config import ConfigError, check_resume_from
from flows.core.environments.rendering import config_renderer
from flows.core.loop.plans import derive_seed, once_per_process
from flows.sft.config import SFTConfig
from flows.sft.corpus import DATA_FIELD, Example, builtin_examples, read_examples
from flows.sft.schedules import scheduled_rate
from whitney.datums import Datum
from whitney.errors import Unprocessable
from whitney.losses import PROVIDER_LOSS_SUPPORT, require_advertised_loss, validate_loss_config
from whitney.renderers import Renderer

LOSS_FUNCTION = "cross_entropy"
EVAL_CHUNK = 64
"""Eval datums per `forward` call."""
SPLIT_SALT = b"whitney-flows eval split\x00"
T = TypeVar("T")


def example_tokens(renderer: Renderer, example: Example) -> tuple[list[int], list[int]]:
    """(prompt tokens, completion tokens) of the example's last assistant turn as `renderer`
    renders it (raw, a pair: BOS + prompt, and the completion + EOS)."""
    return renderer.build_supervised(example.conversation()).last_turn()


class Texted(Protocol):
    """An example or a preference pair: what its place in the eval split depends on."""

    def text(self) -> str: ...


def held_out(examples: Sequence[Texted], fraction: float, salt: bytes = SPLIT_SALT) -> set[int]:
    """Indices of the eval split: the round(n * fraction) examples (at least 1 if fraction > 0)
    with the smallest SHA-256 of `salt` and their text. Depends on the text only, not on order
    or seed, so every flow on the same data (a teacher and its student) holds out the same
    pairs; DPO's pairs use a salt of their own (flows.dpo.pairs.SPLIT_SALT)."""
    if fraction <= 0:
        return set()
    count = max(1, round(len(examples) * fraction))

    def rank(index: int) -> tuple[bytes, int]:
        return hashlib.sha256(salt + examples[index].text().encode()).digest(), index

    return set(sorted(range(len(examples)), key=rank)[:count])


def split_held_out(
    texts: Sequence[Texted],
    items: Sequence[T],
    fraction: float,
    source: str,
    noun: str,
    salt: bytes = SPLIT_SALT,
) -> tuple[tuple[T, ...], tuple[T, ...]]:
    """(train, eval) of `items`, one per text, split by `held_out` (each in file order);
    ConfigError naming eval_fraction if the split leaves nothing to train on."""
    evaluated = held_out(texts, fraction, salt)
    if len(evaluated) >= len(texts):
        raise ConfigError(
            "eval_fraction",
            f"{source} holds {len(texts)} {noun}(s): holding out {len(evaluated)} for eval "
            "leaves none to train on",
        )
    train = tuple(item for index, item in enumerate(items) if index not in evaluated)
    held = tuple(item for index, item in enumerate(items) if index in evaluated)
    return train, held


@dataclass(frozen=True)
class SFTData:
    """Tokenized examples, split into train and eval datums (each in file order)."""

    train: tuple[Datum, ...]
    eval: tuple[Datum, ...]
    source: str

    @property
    def examples(self) -> int:
        return len(self.train) + len(self.eval)


def tokenize(
    examples: Sequence[Example],
    renderer: Renderer,
    source: str,
    eval_fraction: float,
    max_example_tokens: int,
) -> SFTData:
    """Datums of the examples, split; ConfigError naming the line of an example too long or
    one the renderer refuses."""
    datums = []
    for example in examples:
        try:
            rendered = renderer.build_supervised(example.conversation())
        except ValueError as error:
            raise ConfigError(DATA_FIELD, f"{source} line {example.line}: {error}") from None
        if len(rendered.tokens) > max_example_tokens:
            raise ConfigError(
                DATA_FIELD,
                f"{source} line {example.line}: {len(rendered.tokens)} tokens, more "
                f"than max_example_tokens={max_example_tokens}",
            )
        datums.append(rendered.datum())
    train, held = split_held_out(examples, datums, eval_fraction, source, "example")
    return SFTData(train=train, eval=held, source=source)


_data_cache: dict[tuple, SFTData] = {}
_data_lock = threading.Lock()
DATA_CACHE_SIZE = 4


def load_data(config: SFTConfig) -> SFTData:
    """The config's tokenized, split data; cached per process (keyed by the file's path,
    size and mtime), so each cycle subflow does not re-read and re-tokenize it."""
    if config.data_path:
        path = Path(config.data_path)
        try:
            stat = path.stat()
        except OSError as error:
            raise ConfigError(DATA_FIELD, f"cannot read {path}: {error.strerror}") from None
        file_key: tuple = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    else:
        file_key = ("builtin",)
    rendering = (config.base_model, config.tokenizer, config.renderer)
    key = (file_key, rendering, config.eval_fraction, config.max_example_tokens)
    with _data_lock:
        cached = _data_cache.get(key)
    if cached is not None:
        return cached
    renderer = config_renderer(config)
    if config.data_path:
        examples, source = read_examples(config.data_path), str(config.data_path)
    else:
        examples, source = builtin_examples(), "built-in corpus"
    data = tokenize(examples, renderer, source, config.eval_fraction, config.max_example_tokens)
    with _data_lock:
        if len(_data_cache) >= DATA_CACHE_SIZE:
            _data_cache.pop(next(iter(_data_cache)))
        _data_cache[key] = data
    return data


@functools.lru_cache(maxsize=8)
def epoch_order(seed: int, epoch: int, count: int) -> tuple[int, ...]:
    """The order of the training examples in `epoch`: a permutation seeded by (seed, epoch)."""
    order = list(range(count))
    random.Random(derive_seed(seed, epoch)).shuffle(order)
    return tuple(order)


@dataclass(frozen=True)
class SFTPlan:
    """The data of an SFT config and which steps, batches and rates each cycle runs."""

    config: SFTConfig
    data: SFTData

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(len(self.data.train) / self.config.batch_size)

    @property
    def total_steps(self) -> int:
        if self.config.epochs is not None:
            return self.config.epochs * self.batches_per_epoch
        return self.config.steps

    @property
    def steps_per_cycle(self) -> int:
        """An epoch with `epochs`, else `config.steps_per_cycle`."""
        if self.config.epochs is not None:
            return self.batches_per_epoch
        return self.config.steps_per_cycle

    @property
    def cycles(self) -> int:
        return math.ceil(self.total_steps / self.steps_per_cycle)

    def cycle_steps(self, cycle: int) -> range:
        """The optimizer steps (0-based) of `cycle`."""
        if not 0 <= cycle < self.cycles:
            raise ValueError(f"cycle must be within [0, {self.cycles}), got {cycle}")
        start = cycle * self.steps_per_cycle
        return range(start, min(start + self.steps_per_cycle, self.total_steps))

    def batch(self, step: int) -> list[Datum]:
        """The training datums of optimizer step `step`: the step's slice of its epoch's
        order (the last batch of an epoch may be smaller)."""
        epoch, index = divmod(step, self.batches_per_epoch)
        order = epoch_order(self.config.seed, epoch, len(self.data.train))
        size = self.config.batch_size
        return [self.data.train[i] for i in order[index * size : (index + 1) * size]]

    def learning_rate(self, step: int) -> float:
        config = self.config
        return scheduled_rate(
            config.schedule, config.learning_rate, step, self.total_steps, config.warmup_steps
        )

    def eval_due(self, steps_done: int) -> bool:
        """Whether the eval loss is measured after `steps_done` steps (0: before training)."""
        if not self.data.eval:
            return False
        return steps_done % self.config.eval_every == 0 or steps_done == self.total_steps

    def eval_chunks(self) -> list[list[Datum]]:
        """The eval datums, in `forward` calls of at most EVAL_CHUNK."""
        held = list(self.data.eval)
        return [held[i : i + EVAL_CHUNK] for i in range(0, len(held), EVAL_CHUNK)]


def load_sft_plan(config: SFTConfig) -> SFTPlan:
    """The plan of a config; ConfigError naming the field (and line) if the data is bad."""
    return SFTPlan(config, load_data(config))


@once_per_process
def check_sft_config(config: SFTConfig) -> SFTPlan:
    """The plan of a config the provider will accept, checked before anything is allocated;
    ConfigError naming the field (for data: the file and line) otherwise."""
    try:
        require_advertised_loss(config.provider, LOSS_FUNCTION, PROVIDER_LOSS_SUPPORT)
    except ValueError as error:
        raise ConfigError("provider", str(error)) from None
    plan = load_sft_plan(config)
    try:
        validate_loss_config(config.provider, LOSS_FUNCTION, {}, list(plan.data.train[:1]))
    except Unprocessable as error:
        raise ConfigError("provider", error.message) from None
    check_resume_from(config.resume_from, plan.cycles)
    return plan
