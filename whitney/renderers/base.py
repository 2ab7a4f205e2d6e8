"""The renderer interface: chat messages -> token ids and the mask of the tokens the model
learns, the generation prompt of a conversation, the stop tokens of an assistant turn, and the
assistant message of sampled tokens. `TurnRenderer` is the base of the explicit formats, which
render each message on its own: a header (never learned), a body (learned on assistant turns:
the content and the end-of-turn token) and a separator (never learned)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal, TypedDict

from whitney.datums import Datum, tensor
from whitney.tokenizers import Tokenizer

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


class Message(TypedDict):
    """One turn of a conversation, as chat datasets and `apply_chat_template` write it."""

    role: Role
    content: str


Prompt = str | list[Message]
"""What an environment or a dataset gives as a prompt: text (one user turn) or messages."""


def as_messages(prompt: Prompt) -> list[Message]:
    """A prompt as messages: text is one user turn; messages are checked (`check_messages`)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return check_messages(prompt, "prompt")


def check_messages(messages: object, where: str = "messages") -> list[Message]:
    """`messages` if it is a list of {"role", "content"} objects with a known role and string
    content; ValueError naming the first bad entry (`messages[2].role`) otherwise."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where} must be a non-empty list of messages")
    checked: list[Message] = []
    for index, message in enumerate(messages):
        at = f"{where}[{index}]"
        if not isinstance(message, dict):
            raise ValueError(f"{at} must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ValueError(f"{at}.role must be one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"{at}.content must be a string")
        checked.append({"role": role, "content": content})
    return checked


@dataclass(frozen=True)
class Rendered:
    """A rendered conversation: its token ids, and per token 1.0 where the model learns it
    (the content and end-of-turn token of each assistant turn), else 0.0."""

    tokens: list[int]
    weights: list[float]

    def datum(self) -> Datum:
        """The cross_entropy datum: right-shifted, as `sft_datum` builds one (equal to it for a
        prompt followed by one learned completion)."""
        if len(self.tokens) < 2:
            raise ValueError("a rendered conversation needs at least two tokens to train on")
        return {
            "input": {"token_ids": self.tokens[:-1]},
            "loss_inputs": {
                "target_tokens": tensor("int64", self.tokens[1:]),
                "weights": tensor("float32", self.weights[1:]),
            },
        }

    def last_turn(self) -> tuple[list[int], list[int]]:
        """(everything before the last learned span, that span): the prompt and the completion
        of the conversation's last assistant turn."""
        learned = [index for index, weight in enumerate(self.weights) if weight > 0]
        if not learned:
            raise ValueError("the conversation has no assistant turn")
        end = learned[-1] + 1
        start = end
        while start > 0 and self.weights[start - 1] > 0:
            start -= 1
        return self.tokens[:start], self.tokens[start:end]


class Renderer(ABC):
    """Messages <-> token ids for one tokenizer and one chat format."""

    name: ClassVar[str]

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    @property
    @abstractmethod
    def stop_tokens(self) -> tuple[int, ...]:
        """The token ids that end an assistant turn (sampling stops at them)."""

    @abstractmethod
    def build_supervised(self, messages: list[Message]) -> Rendered:
        """The conversation's tokens, and the mask of its assistant turns."""

    @abstractmethod
    def build_generation_prompt(self, messages: list[Message]) -> list[int]:
        """The tokens the model continues with an assistant turn after `messages`."""

    @property
    def signature(self) -> str:
        """What distinguishes this renderer's output from another's on the same tokenizer."""
        return self.name

    def parse_response(self, tokens: list[int]) -> Message:
        """The assistant message of sampled tokens: those before the first stop token."""
        stops = set(self.stop_tokens)
        end = next((i for i, token in enumerate(tokens) if token in stops), len(tokens))
        return {"role": "assistant", "content": self.tokenizer.decode(list(tokens[:end]))}


class TurnRenderer(Renderer):
    """A format that renders each message on its own: `begin`, then per message its header,
    body and separator; the generation prompt ends with an assistant header."""

    def begin(self) -> list[int]:
        """The tokens before the first message."""
        return []

    @abstractmethod
    def header(self, message: Message) -> list[int]:
        """The tokens that open a message (for the generation prompt: content "")."""

    @abstractmethod
    def body(self, message: Message) -> list[int]:
        """The message's content and its end-of-turn token."""

    def separator(self) -> list[int]:
        """The tokens after a message's body."""
        return []

    def build_supervised(self, messages: list[Message]) -> Rendered:
        tokens = self.begin()
        weights = [0.0] * len(tokens)
        for message in messages:
            header, body, separator = self.header(message), self.body(message), self.separator()
            learned = 1.0 if message["role"] == "assistant" else 0.0
            tokens += header + body + separator
            weights += [0.0] * len(header) + [learned] * len(body) + [0.0] * len(separator)
        return Rendered(tokens, weights)

    def build_generation_prompt(self, messages: list[Message]) -> list[int]:
        return self.build_supervised(messages).tokens + self.header(
            {"role": "assistant", "content": ""}
        )


def special_token(tokenizer: Tokenizer, token: str, renderer: str) -> int:
    """The id of a special token the format needs; ValueError if the tokenizer lacks it."""
    lookup = getattr(tokenizer, "token_id", None)
    index = lookup(token) if lookup is not None else None
    if index is None:
        source = getattr(tokenizer, "source", "this tokenizer")
        raise ValueError(f"renderer {renderer} needs the token {token}, which {source} lacks")
    return index
