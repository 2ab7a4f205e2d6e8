"""Tokenizers for Whitney base models, resolved in one place (`get_tokenizer`):

- `local/*`: plain UTF-8 bytes (`ByteTokenizer`);
- `hf:<dir>` (an absolute path): the Hugging Face tokenizer in that directory;
- any other name, `hf:<owner/name>` or a provider's plain `owner/name`: the Hugging Face
  tokenizer of that repo, from the local cache (`whitney.hf_cache`), or downloaded into it
  where the network allows (not with `HF_HUB_OFFLINE`); otherwise a ValueError naming the
  model and how to provide it;
- a `tokenizer` override (a repo id or a local directory) wins over the base model's own.

Hugging Face tokenizers need the optional `hf` extra (transformers), imported on first use.
Pure Python here; no torch.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from whitney import hf_cache

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 260  # 256 bytes, BOS, EOS, PAD and one spare id
HF_PREFIX = "hf:"
LOCAL_PREFIX = "local/"


class Tokenizer(Protocol):
    """What clients use: text <-> token ids, and the begin- and end-of-sequence ids."""

    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are tokens 0..255; special ids are never parsed out of text."""

    vocab_size = VOCAB_SIZE
    bos_id: int | None = BOS_ID
    eos_id = EOS_ID
    pad_id = PAD_ID
    source = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face tokenizer behind the ByteTokenizer interface: `encode` never parses
    special tokens out of text; `encode_special` (for chat template text) does."""

    def __init__(self, tokenizer: Any, source: str) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer of {source} has no end-of-sequence token")
        self._tok = tokenizer
        self.source = source
        """Where it was loaded from (a directory or a repo id)."""
        self.vocab_size: int = len(tokenizer)
        self.bos_id: int | None = tokenizer.bos_token_id
        self.eos_id: int = tokenizer.eos_token_id
        self.pad_id: int | None = tokenizer.pad_token_id
        self.chat_template: str | None = getattr(tokenizer, "chat_template", None) or None
        self.special_ids: frozenset[int] = frozenset(
            tokenizer.all_special_ids
            + [index for index, added in tokenizer.added_tokens_decoder.items() if added.special]
        )

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False, split_special_tokens=True))

    def encode_special(self, text: str) -> list[int]:
        """Text in which special tokens (`<|im_start|>`, ...) are read as themselves."""
        return list(self._tok.encode(text, add_special_tokens=False, split_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        """The id of a token of the vocabulary (a special token such as `<|eot_id|>`), or None."""
        index = self._tok.convert_tokens_to_ids(token)
        return None if index is None or index == self._tok.unk_token_id else int(index)

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, add_generation_prompt: bool
    ) -> list[int]:
        """The chat template's token ids of `messages` (its text, special tokens parsed)."""
        text = self._tok.apply_chat_template(
            messages,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
        return self.encode_special(text)


_loaded: dict[str, HFTokenizer] = {}
_loaded_lock = threading.Lock()


def get_tokenizer(base_model: str, tokenizer: str | None = None) -> Tokenizer:
    """The tokenizer of a base model (see the module docstring), or of `tokenizer` if given
    (a repo id or a local directory); ValueError naming what is missing and how to provide it."""
    if tokenizer:
        directory = Path(tokenizer).expanduser()
        if directory.is_dir():
            return load_hf_tokenizer(str(directory.resolve()))
        if not hf_cache.is_repo_id(tokenizer):
            raise ValueError(
                f"tokenizer {tokenizer!r} is neither a directory nor a Hugging Face repo id "
                "(owner/name)"
            )
        return repo_tokenizer(tokenizer, f"tokenizer {tokenizer!r}")
    if base_model.startswith(LOCAL_PREFIX):
        return ByteTokenizer()
    name = base_model.removeprefix(HF_PREFIX)
    if name.startswith("/"):
        if not Path(name).is_dir():
            raise ValueError(f"base model {base_model!r}: no such directory")
        return load_hf_tokenizer(name)
    return repo_tokenizer(name, f"base model {base_model!r}")


def repo_tokenizer(repo_id: str, what: str) -> HFTokenizer:
    """The tokenizer of a Hugging Face repo: its cached snapshot, else a download."""
    if not hf_cache.is_repo_id(repo_id):
        raise ValueError(
            f"{what} is not a Hugging Face repo id (owner/name), a local/* model or an "
            "hf:<absolute directory>"
        )
    cache = hf_cache.cache_dir()
    cached = hf_cache.snapshot(repo_id, cache)
    if cached is not None:
        return load_hf_tokenizer(str(cached))
    how = (
        f"download it where the network allows (hf download {repo_id}) into that cache, point "
        "HF_HOME or HF_HUB_CACHE at a cache that holds it, or set the `tokenizer` setting to a "
        "local directory with its tokenizer files"
    )
    if hf_cache.offline():
        raise ValueError(
            f"no tokenizer for {what}: {repo_id} is not in the local Hugging Face cache "
            f"({cache}) and HF_HUB_OFFLINE is set; {how}"
        )
    try:
        from transformers import AutoTokenizer

        downloaded = AutoTokenizer.from_pretrained(repo_id, cache_dir=str(cache))
    except ImportError:
        raise ValueError(f"{what} needs the hf extra: pip install -e '.[hf]'") from None
    except Exception as error:  # huggingface_hub and transformers raise many types here
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"no tokenizer for {what}: {repo_id} is not in the local Hugging Face cache "
            f"({cache}) and could not be downloaded ({reason}); {how}"
        ) from None
    return HFTokenizer(downloaded, repo_id)


def load_hf_tokenizer(directory: str) -> HFTokenizer:
    """The Hugging Face tokenizer saved in `directory`, loaded once per process."""
    with _loaded_lock:
        found = _loaded.get(directory)
    if found is not None:
        return found
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(f"{directory}: a Hugging Face tokenizer needs the hf extra") from None
    try:
        loaded = HFTokenizer(
            AutoTokenizer.from_pretrained(directory, local_files_only=True), directory
        )
    except (OSError, ValueError, TypeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"no tokenizer in {directory}: {reason}") from None
    with _loaded_lock:
        return _loaded.setdefault(directory, loaded)
