"""The Qwen chat format (ChatML, as the Qwen2 and Qwen2.5 templates write it):

    <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n

with no default system message (Qwen2.5's template adds one when there is none). A `tool`
message is a user turn holding `<tool_response>\n{content}\n</tool_response>`, as Qwen2.5 writes
a single tool result. An assistant turn learns its content and `<|im_end|>`, its stop token;
the newline after it is a separator, never learned (the model stops before it)."""

from __future__ import annotations

from whitney.renderers.base import Message, TurnRenderer, special_token
from whitney.tokenizers import Tokenizer


class QwenRenderer(TurnRenderer):
    name = "qwen"

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self.im_start = special_token(tokenizer, "<|im_start|>", self.name)
        self.im_end = special_token(tokenizer, "<|im_end|>", self.name)

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        return (self.im_end,)

    def header(self, message: Message) -> list[int]:
        role = "user" if message["role"] == "tool" else message["role"]
        return [self.im_start, *self.tokenizer.encode(role + "\n")]

    def body(self, message: Message) -> list[int]:
        if message["role"] != "tool":
            return self.tokenizer.encode(message["content"]) + [self.im_end]
        return [
            *self.marker("<tool_response>"),
            *self.tokenizer.encode("\n" + message["content"] + "\n"),
            *self.marker("</tool_response>"),
            self.im_end,
        ]

    def separator(self) -> list[int]:
        return self.tokenizer.encode("\n")

    def marker(self, text: str) -> list[int]:
        """A tool-response marker: its own token where the vocabulary has one, else its text."""
        lookup = getattr(self.tokenizer, "token_id", None)
        index = lookup(text) if lookup is not None else None
        return [index] if index is not None else self.tokenizer.encode(text)
