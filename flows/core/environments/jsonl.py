"""The flows' JSON Lines data files (SFT examples, DPO pairs): read, and split into one object
per non-blank line, a bad file or line refused as a ConfigError naming the field, the file and
the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.core.config import ConfigError


def read_text(path: Path, field: str) -> str:
    """The file's UTF-8 text; ConfigError naming `field` and the file if it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(field, f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(field, f"{path} is not UTF-8 text: {error.reason}") from None


def json_objects(text: str, source: str, field: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, "SOURCE line N", object) for each non-blank line of JSONL `text`;
    ConfigError naming `field`, `source` and the line of one that is not a JSON object."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(field, f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise ConfigError(field, f"{where}: expected a JSON object")
        yield number, where, row
