"""What a sweep runs, as pure functions of its config (no Prefect): the trials (a grid's every
combination, or `samples` seeded draws), each trial's config at a rung, and which trials a
rung keeps.

    trials = check_sweep_config(config)          # every trial's config checked at full length
    settings = trial_settings(config, trials[0], cycles=10, resume_from=None)
    kept = survivors({0: 0.4, 1: 0.9, 2: None}, mode="max", keep=0.5)   # [1]
"""

from __future__ import annotations

import itertools
import math
import random
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from flows.core.config import ConfigError, validated
from flows.sweep.config import RandomRange, SweepConfig
from flows.sweep.kinds import TrialKind, trial_kind


@dataclass(frozen=True)
class Trial:
    """One point of the search: its number and its values of the swept fields."""

    index: int
    params: dict[str, Any]


def model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`X`, `X | None`, `Annotated[X, ...]`), if any."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return model_of(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        models = [model_of(arg) for arg in typing.get_args(annotation)]
        return next((model for model in models if model is not None), None)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def has_field(model: type[BaseModel], path: str) -> bool:
    """Whether the dotted `path` names a field of `model` (through nested models; any key of
    a mapping field)."""
    head, _, rest = path.partition(".")
    field = model.model_fields.get(head)
    if field is None:
        return False
    if not rest:
        return True
    if typing.get_origin(field.annotation) is dict:  # loss_config.<key>: any key
        return "." not in rest
    nested = model_of(field.annotation)
    return nested is not None and has_field(nested, rest)


def check_paths(kind: TrialKind, where: str, paths: typing.Iterable[str]) -> None:
    """ConfigError naming the first path that is no field of the kind's config, or that the
    sweep sets itself."""
    for path in paths:
        if not has_field(kind.config, path):
            raise ConfigError(f"{where}.{path}", f"{kind.config.__name__} has no field {path!r}")
        if path.split(".")[0] in kind.sizing + ("resume_from",):
            raise ConfigError(f"{where}.{path}", "the sweep sets it (from rungs)")


def nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """`{"a.b": 1, "c": 2}` -> `{"a": {"b": 1}, "c": 2}`."""
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, leaf = path.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def merged(base: Mapping[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `more` on top, nested mappings merged key by key."""
    out = dict(base)
    for key, value in more.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def draw(rng: random.Random, spec: RandomRange) -> Any:
    """One value of `spec`."""
    if spec.values is not None:
        return rng.choice(spec.values)
    low, high = float(spec.low), float(spec.high)  # type: ignore[arg-type]
    value = (
        math.exp(rng.uniform(math.log(low), math.log(high))) if spec.log else rng.uniform(low, high)
    )
    return round(value) if spec.integer else value


def expand(config: SweepConfig) -> list[Trial]:
    """The trials: the grid's combinations (its fields in alphabetical order, the last varying
    fastest), or `samples` draws of every random field in alphabetical order, from
    `random.Random(seed)`. Not in the order written: a Prefect server on PostgreSQL keeps a
    run's parameters as JSONB, which keeps no key order, so a trial's number would change."""
    if config.search == "grid":
        paths = sorted(config.grid)
        combinations = itertools.product(*(config.grid[path] for path in paths))
        return [
            Trial(i, dict(zip(paths, values, strict=True))) for i, values in enumerate(combinations)
        ]
    rng = random.Random(config.seed)
    return [
        Trial(i, {path: draw(rng, config.random[path]) for path in sorted(config.random)})
        for i in range(config.samples)
    ]


def trial_settings(
    config: SweepConfig, trial: Trial, cycles: int, resume_from: str | None
) -> dict[str, Any]:
    """The trial's config at a rung of `cycles` cycles: base, the trial's values, its length,
    and where it continues from."""
    kind = trial_kind(config.kind)
    settings = merged(config.base, nested(trial.params))
    settings.update(kind.sized(settings, cycles))
    if resume_from is not None:
        settings["resume_from"] = resume_from
    return settings


def check_sweep_config(config: SweepConfig) -> list[Trial]:
    """The trials, after checking the sweep before anything runs: the kind, every swept and
    base field, the rungs, and every trial's config at full length (ConfigError naming the
    field, and the trial)."""
    kind = trial_kind(config.kind)
    searched = config.grid if config.search == "grid" else config.random
    where = "grid" if config.search == "grid" else "random"
    if not searched:
        raise ConfigError(where, f"nothing to search: give {where} fields (search = {where})")
    check_paths(kind, where, searched)
    check_paths(kind, "base", config.base)
    for path, values in config.grid.items():
        if not values:
            raise ConfigError(f"grid.{path}", "no value to try")
    if any(later <= earlier for earlier, later in itertools.pairwise(config.rungs)):
        raise ConfigError("rungs", f"must increase: {config.rungs}")
    if config.rungs[0] < 1:
        raise ConfigError("rungs", "a rung trains at least one cycle")
    trials = expand(config)
    for trial in trials:
        try:
            validated(kind.config, trial_settings(config, trial, config.rungs[-1], None))
        except ConfigError as error:
            raise ConfigError(
                error.field, f"{error.message} (trial {trial.index}: {trial.params})"
            ) from None
    return trials


def ranking(scores: Mapping[int, float | None], mode: str) -> list[int]:
    """The trials with a score, best first (`mode` max: the most), ties to the lower number."""
    sign = -1.0 if mode == "max" else 1.0
    scored = [(sign * score, index) for index, score in scores.items() if score is not None]
    return [index for _, index in sorted(scored)]


def survivors(scores: Mapping[int, float | None], mode: str, keep: float) -> list[int]:
    """The trials a rung keeps: the ceil(keep * n) best of the n trials that ran it (at least
    one); a trial with no score (it failed) never."""
    count = max(1, math.ceil(keep * len(scores)))
    return sorted(ranking(scores, mode)[:count])


def best_trial(scores: Mapping[int, float | None], mode: str) -> int | None:
    """The trial with the best score; None if none has one."""
    ranked = ranking(scores, mode)
    return ranked[0] if ranked else None
