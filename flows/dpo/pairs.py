"""Preference pairs: read from a JSONL file, rendered by the config's renderer into token
sequences, split into train and held-out pairs, and the pairs each cycle trains on. No
Prefect, no torch.

A line is `{"prompt": str, "chosen": str, "rejected": str}` or `{"messages": [...], "chosen":
str, "rejected": str}` (the conversation before the two candidate assistant turns). Other
fields are ignored; blank lines are skipped. Errors name the field and the line:
`ConfigError("data_path", "<file> line 7: field 'rejected' is empty")`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.core.config import ConfigError
from flows.core.environments.jsonl import json_objects, read_text
from whitney.renderers import Message, Prompt, Renderer, as_messages, check_messages

DATA_FIELD = "data_path"
ANSWERS = ("chosen", "rejected")
SPLIT_SALT = b"whitney-flows dpo eval split\x00"
"""The salt of the pairs' eval split (flows.sft.plan.held_out)."""


@dataclass(frozen=True)
class Pair:
    """One preference pair as text, and its line in the file (1-based)."""

    prompt: Prompt
    chosen: str
    rejected: str
    line: int = 0

    def conversation(self, answer: str) -> list[Message]:
        """The prompt's messages followed by `answer` as the assistant turn."""
        return [*as_messages(self.prompt), {"role": "assistant", "content": answer}]

    def text(self) -> str:
        """Canonical JSON of the pair, by which the eval split picks it."""
        fields = {"prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected}
        return json.dumps(fields, sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True)
class PairTokens:
    """A rendered pair: the prompt's tokens and each answer's (the learned span of the
    assistant turn: with the raw renderer, BOS + prompt and the answer + EOS)."""

    prompt: tuple[int, ...]
    chosen: tuple[int, ...]
    rejected: tuple[int, ...]

    def sequences(self) -> list[list[int]]:
        """prompt + chosen, prompt + rejected."""
        return [[*self.prompt, *self.chosen], [*self.prompt, *self.rejected]]


def parse_pair(row: dict[str, Any], where: str, number: int) -> Pair:
    """The pair of one JSON object; ConfigError naming the field and `where` otherwise."""
    for name in ANSWERS:
        if name not in row:
            raise ConfigError(DATA_FIELD, f"{where}: missing field {name!r}")
        if not isinstance(row[name], str):
            raise ConfigError(DATA_FIELD, f"{where}: field {name!r} must be a string")
        if not row[name].strip():
            raise ConfigError(DATA_FIELD, f"{where}: field {name!r} is empty")
    if row["chosen"] == row["rejected"]:
        raise ConfigError(DATA_FIELD, f"{where}: 'chosen' and 'rejected' are the same answer")
    if "messages" in row:
        try:
            prompt: Prompt = check_messages(row["messages"])
        except ValueError as error:
            raise ConfigError(DATA_FIELD, f"{where}: {error}") from None
    elif isinstance(row.get("prompt"), str):
        prompt = row["prompt"]
    else:
        raise ConfigError(DATA_FIELD, f"{where}: needs a string 'prompt' or a 'messages' list")
    return Pair(prompt, row["chosen"], row["rejected"], number)


def parse_pairs(text: str, source: str) -> list[Pair]:
    """The pairs of JSONL `text`; ConfigError naming `source` and the line otherwise."""
    pairs = [parse_pair(row, where, n) for n, where, row in json_objects(text, source, DATA_FIELD)]
    if not pairs:
        raise ConfigError(DATA_FIELD, f"{source} holds no pairs")
    return pairs


def read_pairs(path: str | Path) -> list[Pair]:
    """The pairs of a JSONL file; ConfigError naming the file (and line) if it is bad."""
    return parse_pairs(read_text(Path(path), DATA_FIELD), str(path))


def render_pair(renderer: Renderer, pair: Pair, where: str, max_tokens: int) -> PairTokens:
    """The pair's tokens; ConfigError naming `where` if the renderer refuses it, its two
    prompts differ, or a sequence is longer than `max_tokens`."""
    try:
        chosen = renderer.build_supervised(pair.conversation(pair.chosen)).last_turn()
        rejected = renderer.build_supervised(pair.conversation(pair.rejected)).last_turn()
    except ValueError as error:
        raise ConfigError(DATA_FIELD, f"{where}: {error}") from None
    if chosen[0] != rejected[0]:
        raise ConfigError(
            DATA_FIELD, f"{where}: the renderer gives the two answers different prompts"
        )
    tokens = PairTokens(tuple(chosen[0]), tuple(chosen[1]), tuple(rejected[1]))
    longest = max(len(sequence) for sequence in tokens.sequences())
    if longest > max_tokens:
        raise ConfigError(
            DATA_FIELD,
            f"{where}: {longest} tokens, more than max_pair_tokens={max_tokens}",
        )
    return tokens
