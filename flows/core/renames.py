"""Renamed config fields: a model's `RENAMED` (old name -> new) lets a config file, a stored
Prefect parameter or event, or `--set` still say the old name, with one deprecation line
(`RenamedSetting`, a FutureWarning; `whitney-flows` prints it as one line). No Prefect."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

from pydantic import BaseModel, model_validator


class RenamedSetting(FutureWarning):
    """An old name of a renamed config field, taken as its new name."""


def warn_renamed(old: str, new: str) -> None:
    """The deprecation line of a setting given by its old name."""
    warnings.warn(f"{old} is deprecated: it is now {new}", RenamedSetting, stacklevel=3)


class RenamedFields(BaseModel):
    """A config model whose `RENAMED` fields are taken by their old names too."""

    RENAMED: ClassVar[dict[str, str]] = {}
    """Old field name -> new."""

    @model_validator(mode="before")
    @classmethod
    def renamed_fields(cls, data: Any) -> Any:
        """`data` with the old names of renamed fields replaced by the new."""
        if not isinstance(data, dict) or not cls.RENAMED.keys() & data.keys():
            return data
        data = dict(data)
        for old, new in cls.RENAMED.items():
            if old in data:
                if new in data:
                    raise ValueError(f"{old} is the old name of {new}: give only {new}")
                warn_renamed(old, new)
                data[new] = data.pop(old)
        return data
