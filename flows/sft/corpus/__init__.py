"""(prompt, completion) text pairs for SFT: read from a JSONL file, or the built-in corpus.

The built-in corpus, `animals.jsonl` (package data), is 312 short question/answer pairs
about a made-up world of 24 animals and six attributes each (colour, food, home, sound, legs,
size), every fact asked in two phrasings plus one description per animal. It is written by a
deterministic script, `python -m flows.sft.corpus.generate`, and a test checks that the shipped
file is exactly its output. The answers follow fixed templates and restate facts that other
training pairs state too, so the byte-level `local/*` models learn it quickly and their loss
on held-out pairs falls well below half of where it starts.

A JSONL file holds one JSON object per line with string fields `prompt` and `completion`
(other fields are ignored; blank lines are skipped). Errors name the line:
`ConfigError("data_path", "<file> line 7: ...")`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from flows.core.config import ConfigError

BUILTIN_CORPUS = "animals.jsonl"
DATA_FIELD = "data_path"


@dataclass(frozen=True)
class Example:
    """One SFT pair, and the line of its file (1-based) for error messages."""

    prompt: str
    completion: str
    line: int = 0


def parse_examples(text: str, source: str) -> list[Example]:
    """The examples of JSONL `text`; ConfigError naming `source` and the line otherwise."""
    examples = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(DATA_FIELD, f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise ConfigError(DATA_FIELD, f"{where}: expected a JSON object")
        for name in ("prompt", "completion"):
            if name not in row:
                raise ConfigError(DATA_FIELD, f"{where}: missing field {name!r}")
            if not isinstance(row[name], str):
                raise ConfigError(DATA_FIELD, f"{where}: field {name!r} must be a string")
        if not row["completion"]:
            raise ConfigError(DATA_FIELD, f"{where}: field 'completion' is empty")
        examples.append(Example(row["prompt"], row["completion"], number))
    if not examples:
        raise ConfigError(DATA_FIELD, f"{source} holds no examples")
    return examples


def read_examples(path: str | Path) -> list[Example]:
    """The examples of a JSONL file; ConfigError naming the file (and line) if it is bad."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(DATA_FIELD, f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(DATA_FIELD, f"{path} is not UTF-8 text: {error.reason}") from None
    return parse_examples(text, str(path))


def builtin_text() -> str:
    """The built-in corpus file's text."""
    return resources.files(__name__).joinpath(BUILTIN_CORPUS).read_text(encoding="utf-8")


def builtin_examples() -> list[Example]:
    """The built-in corpus (see the module docstring)."""
    return parse_examples(builtin_text(), f"built-in corpus {BUILTIN_CORPUS}")
