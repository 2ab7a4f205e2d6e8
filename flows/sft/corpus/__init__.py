"""SFT examples, (prompt, completion) pairs or conversations: read from a JSONL file, or the
built-in corpus of pairs.

The built-in corpus, `animals.jsonl` (package data), is 312 short question/answer pairs
about a made-up world of 24 animals and six attributes each (colour, food, home, sound, legs,
size), every fact asked in two phrasings plus one description per animal. It is written by a
deterministic script, `python -m flows.sft.corpus.generate`, and a test checks that the shipped
file is exactly its output. The answers follow fixed templates and restate facts that other
training pairs state too, so the byte-level `local/*` models learn it quickly and their loss
on held-out pairs falls well below half of where it starts.

A JSONL file holds one JSON object per line: a pair, with string fields `prompt` and
`completion`, or a conversation, `{"messages": [{"role": ..., "content": ...}, ...]}` with
roles system, user, assistant or tool and at least one assistant turn (SFT trains on every
assistant turn; the last one is its completion). Other fields are ignored; blank lines are
skipped. Errors name the line: `ConfigError("data_path", "<file> line 7: ...")`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from flows.core.config import ConfigError
from flows.core.environments.jsonl import json_objects, read_text
from whitney.renderers import Message, Prompt, check_messages

BUILTIN_CORPUS = "animals.jsonl"
DATA_FIELD = "data_path"


@dataclass(frozen=True)
class Example:
    """One SFT example, and the line of its file (1-based) for error messages: a pair, or a
    conversation (`messages`), whose `prompt` is every message before its last assistant turn
    and whose `completion` is that turn's content."""

    prompt: Prompt
    completion: str
    line: int = 0
    messages: tuple[Message, ...] = ()

    def conversation(self) -> list[Message]:
        """Every turn: the conversation's, or a pair's as a user and an assistant turn."""
        if self.messages:
            return list(self.messages)
        assert isinstance(self.prompt, str)
        return [
            {"role": "user", "content": self.prompt},
            {"role": "assistant", "content": self.completion},
        ]

    def text(self) -> str:
        """The example's text, by which the eval split picks it: a pair's prompt and
        completion, a conversation's messages as canonical JSON."""
        if self.messages:
            return json.dumps(self.messages, sort_keys=True, ensure_ascii=False)
        return f"{self.prompt}\x00{self.completion}"


def parse_pair(row: dict[str, Any], where: str, number: int) -> Example:
    for name in ("prompt", "completion"):
        if name not in row:
            raise ConfigError(DATA_FIELD, f"{where}: missing field {name!r} (or 'messages')")
        if not isinstance(row[name], str):
            raise ConfigError(DATA_FIELD, f"{where}: field {name!r} must be a string")
    if not row["completion"]:
        raise ConfigError(DATA_FIELD, f"{where}: field 'completion' is empty")
    return Example(row["prompt"], row["completion"], number)


def parse_conversation(row: dict[str, Any], where: str, number: int) -> Example:
    try:
        messages = check_messages(row["messages"])
    except ValueError as error:
        raise ConfigError(DATA_FIELD, f"{where}: {error}") from None
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        raise ConfigError(DATA_FIELD, f"{where}: messages hold no assistant turn to train on")
    if not messages[last]["content"]:
        raise ConfigError(DATA_FIELD, f"{where}: messages[{last}].content is empty")
    return Example(messages[:last], messages[last]["content"], number, tuple(messages))


def parse_examples(text: str, source: str) -> list[Example]:
    """The examples of JSONL `text`; ConfigError naming `source` and the line otherwise."""
    examples = [
        (parse_conversation if "messages" in row else parse_pair)(row, where, number)
        for number, where, row in json_objects(text, source, DATA_FIELD)
    ]
    if not examples:
        raise ConfigError(DATA_FIELD, f"{source} holds no examples")
    return examples


def read_examples(path: str | Path) -> list[Example]:
    """The examples of a JSONL file; ConfigError naming the file (and line) if it is bad."""
    return parse_examples(read_text(Path(path), DATA_FIELD), str(path))


def builtin_text() -> str:
    """The built-in corpus file's text."""
    return resources.files(__name__).joinpath(BUILTIN_CORPUS).read_text(encoding="utf-8")


def builtin_examples() -> list[Example]:
    """The built-in corpus (see the module docstring)."""
    return parse_examples(builtin_text(), f"built-in corpus {BUILTIN_CORPUS}")
