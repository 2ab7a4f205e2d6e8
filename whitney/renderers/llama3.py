"""The Llama 3 chat format, as Meta's Llama 3 Instruct template writes it:

    <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>...

then `<|start_header_id|>assistant<|end_header_id|>\n\n` to generate. No default system
message (Llama 3.1's template adds a dated one). A `tool` message takes the role `ipython`,
as Llama 3.1 names tool output. An assistant turn learns its content and `<|eot_id|>`, which is
its stop token. The header and the content are encoded apart (the template encodes them as one
text, which gives the same tokens: Llama 3's pre-tokenizer splits at the newlines)."""

from __future__ import annotations

from whitney.renderers.base import Message, TurnRenderer, special_token
from whitney.tokenizers import Tokenizer

ROLE_NAMES = {"tool": "ipython"}


class Llama3Renderer(TurnRenderer):
    name = "llama3"

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self.begin_of_text, self.start_header, self.end_header, self.eot = (
            special_token(tokenizer, token, self.name)
            for token in (
                "<|begin_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
            )
        )

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        return (self.eot,)

    def begin(self) -> list[int]:
        return [self.begin_of_text]

    def header(self, message: Message) -> list[int]:
        role = ROLE_NAMES.get(message["role"], message["role"])
        return [
            self.start_header,
            *self.tokenizer.encode(role),
            self.end_header,
            *self.tokenizer.encode("\n\n"),
        ]

    def body(self, message: Message) -> list[int]:
        return self.tokenizer.encode(message["content"].strip()) + [self.eot]
