"""The model's own chat template (`apply_chat_template` of its Hugging Face tokenizer).

The mask of an assistant turn is found by rendering prefixes: its learned tokens start where
the rendering of the messages before it, with the generation prompt, ends, and run through the
first stop token after that (the newline a template may write after it is not learned). This
needs a template that renders earlier turns the same whatever follows them; one that does not
(Qwen3's drops the reasoning of earlier turns) is refused with the turn named.

The stop tokens are the tokenizer's end-of-sequence token and the first special token the
template writes after an assistant turn's content (`<|eot_id|>`, `<|im_end|>`, ...)."""

from __future__ import annotations

import hashlib
from typing import Any

from whitney.renderers.base import Message, Rendered, Renderer

PROBE: list[Message] = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


class ChatTemplateRenderer(Renderer):
    name = "chat_template"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.source = getattr(tokenizer, "source", "the tokenizer")
        self.template: str | None = getattr(tokenizer, "chat_template", None)
        if not self.template:
            raise ValueError(f"renderer chat_template: {self.source} has no chat template")
        prompt = self.render(PROBE[:1], generation=True)
        turn = self.render(PROBE, generation=False)
        self.require_prefix(prompt, turn, 1)
        specials = tokenizer.special_ids
        end_of_turn = [token for token in turn[len(prompt) :] if token in specials][:1]
        self._stop_tokens = tuple(dict.fromkeys([*end_of_turn, tokenizer.eos_id]))

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        return self._stop_tokens

    @property
    def signature(self) -> str:
        assert self.template is not None
        return f"{self.name}:{hashlib.sha256(self.template.encode()).hexdigest()[:16]}"

    def render(self, messages: list[Message], *, generation: bool) -> list[int]:
        try:
            return self.tokenizer.apply_chat_template(
                [dict(message) for message in messages], add_generation_prompt=generation
            )
        except Exception as error:  # jinja2 raises TemplateError and others
            raise ValueError(f"the chat template of {self.source} refused: {error}") from None

    def require_prefix(self, prefix: list[int], whole: list[int], turn: int) -> None:
        if whole[: len(prefix)] != prefix:
            raise ValueError(
                f"the chat template of {self.source} renders the conversation before message "
                f"{turn} differently once the conversation goes on, so the tokens of that "
                "assistant turn cannot be found; use renderer raw, llama3 or qwen"
            )

    def build_generation_prompt(self, messages: list[Message]) -> list[int]:
        return self.render(messages, generation=True)

    def build_supervised(self, messages: list[Message]) -> Rendered:
        tokens = self.render(messages, generation=False)
        weights = [0.0] * len(tokens)
        stops = set(self.stop_tokens)
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = self.render(messages[:index], generation=True)
            through = self.render(messages[: index + 1], generation=False)
            self.require_prefix(prompt, tokens, index)
            self.require_prefix(through, tokens, index + 1)
            end = next(
                (at + 1 for at in range(len(prompt), len(through)) if through[at] in stops),
                len(through),
            )
            weights[len(prompt) : end] = [1.0] * (end - len(prompt))
        return Rendered(tokens, weights)
