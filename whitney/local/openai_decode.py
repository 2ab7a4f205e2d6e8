"""`ChoiceText`: one choice of an OpenAI-compatible answer, decoded as its tokens are sampled
into the text pieces a stream sends, which join to exactly the whole answer's text (the same
object makes both). docs/openai.md, Streaming, is the contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from whitney.tokenizers import Tokenizer

INCOMPLETE = "\ufffd"  # what a character split over tokens decodes to until its last byte

Top = list[tuple[int, float]]  # the most likely tokens at one position, with their logprobs


@dataclass(frozen=True)
class Piece:
    """A choice's next text, the tokens it completes (with their logprobs and alternatives),
    and, on its last piece, why the choice ended."""

    index: int
    text: str
    tokens: list[int]
    logprobs: list[float]
    top: list[Top]
    finish_reason: Literal["stop", "length"] | None = None


@dataclass
class ChoiceText:
    """Choice `index` being decoded: a stop token ends it and is left out; a stop string ends
    it before the string (the tokens that complete it left out too). Text is sent once it can
    no longer change: not a character still incomplete, not what may yet begin a stop string."""

    index: int
    tokenizer: Tokenizer
    stops: tuple[str, ...]
    stop_ids: frozenset[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[Top] = field(default_factory=list)
    text: str = ""  # the whole text once finished
    sent: str = ""
    covered: int = 0  # the tokens whose text `sent` holds
    finish_reason: Literal["stop", "length"] | None = None

    def add(self, token: int, logprob: float, top: Top, end: str | None) -> Piece | None:
        """The piece that sampling `token` lets go (None if none yet); `end` is how the engine
        ended the choice ("stop", "length", None). A stop string ends it here whatever `end`."""
        if self.finish_reason is not None:
            return None
        if end == "stop" and token in self.stop_ids:
            self.finish_reason = "stop"
        else:
            self.tokens.append(token)
            self.logprobs.append(logprob)
            self.top.append(top)
            if end is not None:
                self.finish_reason = "length"
        text = self.tokenizer.decode(self.tokens)
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            text, self.finish_reason = text[:cut], "stop"
            decode = self.tokenizer.decode
            keep = next(
                k for k in range(len(self.tokens) + 1) if len(decode(self.tokens[:k])) >= cut
            )
            del self.tokens[keep:], self.logprobs[keep:], self.top[keep:]
        if self.finish_reason is not None:
            self.text = text
            return self._piece(text, len(self.tokens))
        ready = text.rstrip(INCOMPLETE)
        ready = ready[: len(ready) - self._held(ready)]
        if len(ready) <= len(self.sent) or not ready.startswith(self.sent):
            return None
        covered = self.covered
        while covered < len(self.tokens) and len(
            self.tokenizer.decode(self.tokens[: covered + 1])
        ) <= len(ready):
            covered += 1
        return self._piece(ready, covered)

    def _held(self, text: str) -> int:
        """How many last characters of `text` may be the beginning of a stop string."""
        return max(
            (j for s in self.stops for j in range(1, len(s)) if text.endswith(s[:j])), default=0
        )

    def _piece(self, text: str, covered: int) -> Piece:
        start, self.covered = self.covered, covered
        piece = Piece(
            self.index,
            text[len(self.sent) :],
            self.tokens[start:covered],
            self.logprobs[start:covered],
            self.top[start:covered],
            self.finish_reason,
        )
        self.sent = text
        return piece
