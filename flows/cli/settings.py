"""`--set FIELD=VALUE`: any field of a flow's config model from the command line, read from the
model itself (no hand-kept list). FIELD is dotted for a nested setting (`rollout.max_turns`,
`tracking.backends`, a key of a table such as `loss_config.beta`); VALUE is JSON when it parses
as JSON the field accepts (numbers, true/false, null, lists, tables), else the text itself. A
FIELD the model lacks is a ConfigError naming it and the nearest valid name; an old name of a
renamed field (a model's `RENAMED`) is taken with one deprecation line. No Prefect.

    apply_settings(RLConfig, {}, ["learning_rate=0.01", "rollout.max_turns=3"])
"""

from __future__ import annotations

import difflib
import json
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from flows.core.config import ConfigError
from flows.core.renames import warn_renamed


@dataclass(frozen=True)
class Setting:
    """One settable field of a config model: its dotted path and its pydantic field."""

    path: str
    field: FieldInfo

    @property
    def annotation(self) -> Any:
        return self.field.annotation


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The config model a field holds (also when it may be empty), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        models = [arg for arg in get_args(annotation) if nested_model(arg) is not None]
        return models[0] if len(models) == 1 else None
    return None


def is_table(annotation: Any) -> bool:
    """Whether a field is a table of free keys (dict), which `FIELD.KEY` may set."""
    return get_origin(annotation) is dict


def settable_fields(model: type[BaseModel], prefix: str = "") -> Iterator[Setting]:
    """Every leaf setting of `model`, nested models walked into (dotted paths), in order."""
    for name, field in model.model_fields.items():
        inner = nested_model(field.annotation)
        if inner is None:
            yield Setting(prefix + name, field)
        else:
            yield from settable_fields(inner, f"{prefix}{name}.")


def resolved_path(model: type[BaseModel], path: str) -> tuple[list[str], Any]:
    """The path's parts (old names of renamed fields replaced, with a deprecation line) and
    the annotation of the field it sets; ConfigError naming the field and the nearest valid
    name if the model has no such field."""
    parts = path.split(".")
    current: type[BaseModel] | None = model
    annotation: Any = None
    resolved: list[str] = []
    for index, part in enumerate(parts):
        if current is None:
            if is_table(annotation) and index == len(parts) - 1:
                resolved.append(part)
                return resolved, get_args(annotation)[1] if get_args(annotation) else Any
            raise ConfigError(f"--set {path}", f"{'.'.join(resolved)} has no settings inside")
        renamed = getattr(current, "RENAMED", {})
        if part in renamed:
            warn_renamed(".".join([*resolved, part]), ".".join([*resolved, renamed[part]]))
            part = renamed[part]
        if part not in current.model_fields:
            raise ConfigError(f"--set {path}", no_such_field(model, path))
        resolved.append(part)
        annotation = current.model_fields[part].annotation
        current = nested_model(annotation)
    if current is not None:
        annotation = dict[str, Any]  # a whole table: its settings as JSON
    return resolved, annotation


def no_such_field(model: type[BaseModel], path: str) -> str:
    """The message for a path `model` has no field at, with the nearest valid name."""
    names = [setting.path for setting in settable_fields(model)]
    names += [name for name in model.model_fields if name not in names]
    nearest = difflib.get_close_matches(path, names, n=1, cutoff=0.6)
    hint = f" (did you mean {nearest[0]}?)" if nearest else " (every field: --help)"
    return f"{model.__name__} has no such field{hint}"


def parsed_value(text: str, annotation: Any) -> Any:
    """VALUE as JSON if it parses and the field's type takes it, else the text itself (the
    model's validation then names the field if the text is no good either)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    try:
        TypeAdapter(annotation).validate_python(value)
    except (ValidationError, TypeError):
        return text if isinstance(value, int | float | bool) or value is None else value
    return value


def split_setting(setting: str) -> tuple[str, str]:
    """FIELD=VALUE as (field, value text); ConfigError if it is not of that form."""
    field, equals, text = setting.partition("=")
    if not equals or not field.strip():
        raise ConfigError("--set", f"{setting!r}: expected FIELD=VALUE")
    return field.strip(), text


def apply_settings(
    model: type[BaseModel], data: dict[str, Any], settings: list[str] | None
) -> dict[str, Any]:
    """`data` (a config's settings, as a file holds them) with each FIELD=VALUE of `settings`
    set in it, in order; ConfigError naming a field `model` does not have."""
    for setting in settings or []:
        field, text = split_setting(setting)
        parts, annotation = resolved_path(model, field)
        table = data
        for depth, part in enumerate(parts[:-1]):
            inner = table.get(part)
            if inner is None:
                inner = table[part] = {}
            if not isinstance(inner, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError(f"--set {field}", f"{where} is not a table of settings")
            table = inner
        table[parts[-1]] = parsed_value(text, annotation)
    return data


def type_text(annotation: Any) -> str:
    """A field's type as `--help` and docs/config.md show it."""
    if get_origin(annotation) is Annotated:
        return type_text(get_args(annotation)[0])
    if get_origin(annotation) is Literal:
        return " | ".join(str(arg) for arg in get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType):
        return " | ".join(type_text(arg) for arg in get_args(annotation))
    if annotation is type(None):
        return "empty"
    if get_origin(annotation) in (list, tuple, set):
        return f"list of {type_text(get_args(annotation)[0])}"
    if get_origin(annotation) is dict:
        return f"table of {type_text(get_args(annotation)[1])}"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: FieldInfo) -> str:
    """A field's default as `--help` and docs/config.md show it (JSON, `null` for empty)."""
    if field.is_required():
        return "required"
    default = field.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        default = default.model_dump(mode="json")
    try:
        return json.dumps(default)
    except TypeError:
        return str(default)
