"""Tokenizers for Whitney base models: plain UTF-8 bytes for `local/*`, the cached Hugging Face
tokenizer for `hf:<repo>`. Pure Python; no torch."""

from __future__ import annotations

from typing import Any, Protocol

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 260  # 256 bytes, BOS, EOS, PAD and one spare id


class Tokenizer(Protocol):
    """What clients use: text <-> token ids, and the end-of-sequence id."""

    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are tokens 0..255; special ids are never parsed out of text."""

    vocab_size = VOCAB_SIZE
    bos_id = BOS_ID
    eos_id = EOS_ID
    pad_id = PAD_ID

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """The locally cached Hugging Face tokenizer of `repo`, behind the ByteTokenizer interface."""

    def __init__(self, repo: str) -> None:
        from transformers import AutoTokenizer  # lazy: the optional `hf` extra

        self._tok: Any = AutoTokenizer.from_pretrained(repo, local_files_only=True)
        self.vocab_size: int = len(self._tok)
        self.bos_id: int | None = self._tok.bos_token_id
        self.eos_id: int = self._tok.eos_token_id
        self.pad_id: int | None = self._tok.pad_token_id

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False, split_special_tokens=True))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def get_tokenizer(base_model: str) -> Tokenizer:
    """The tokenizer of a Whitney base model name (`local/*` or `hf:<repo id>`)."""
    if base_model.startswith("local/"):
        return ByteTokenizer()
    if base_model.startswith("hf:"):
        try:
            return HFTokenizer(base_model.removeprefix("hf:"))
        except (ImportError, OSError) as exc:
            raise ValueError(f"no locally cached tokenizer for base model {base_model!r}") from exc
    raise ValueError(f"unknown base model {base_model!r}: expected 'local/<name>' or 'hf:<repo>'")
