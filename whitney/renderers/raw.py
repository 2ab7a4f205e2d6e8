"""The raw renderer: no markup. BOS (where the tokenizer has one), then each message's text;
an assistant turn is its text and EOS, learned. A (prompt, completion) pair renders as BOS +
prompt, completion + EOS: what the flows did before renderers."""

from __future__ import annotations

from whitney.renderers.base import Message, TurnRenderer


class RawRenderer(TurnRenderer):
    name = "raw"

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        return (self.tokenizer.eos_id,)

    def begin(self) -> list[int]:
        bos = self.tokenizer.bos_id
        return [] if bos is None else [bos]

    def header(self, message: Message) -> list[int]:
        return []

    def body(self, message: Message) -> list[int]:
        text = self.tokenizer.encode(message["content"])
        return text + [self.tokenizer.eos_id] if message["role"] == "assistant" else text
