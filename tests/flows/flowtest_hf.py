"""What the flow tests on Hugging Face checkpoints share: chat data, an environment whose
prompts are messages (loaded by import path `flowtest_hf:...`), and the Llama 3 and Qwen
formats written out by hand, to check what the flows sent."""

from __future__ import annotations

from typing import Any

from flows.core.environments import Completion, character_share
from whitney.renderers import Message

ANIMALS = (("cat", "fish"), ("dog", "meat"), ("cow", "grass"), ("bird", "seeds"))
ASK = ({"role": "user", "content": "Count to five."},)
SYSTEM: Message = {"role": "system", "content": "Answer with a number."}


def conversations() -> list[list[Message]]:
    """16 short chats: one or two assistant turns, some with a system message."""
    chats: list[list[Message]] = []
    for index, (animal, food) in enumerate(ANIMALS * 4):
        chat: list[Message] = [{"role": "system", "content": "Be brief."}] if index % 2 else []
        chat += [
            {"role": "user", "content": f"What does the {animal} eat?"},
            {"role": "assistant", "content": f"The {animal} eats {food}."},
        ]
        if index % 4 >= 2:
            chat += [
                {"role": "user", "content": "And how many?"},
                {"role": "assistant", "content": f"{index + 1} {food}."},
            ]
        chats.append(chat)
    return chats


class ChatNumbers:
    """Prompts as messages (a system and a user turn); reward: the share of digits."""

    def prompts(self, cycle: int, count: int, seed: int) -> list[list[Message]]:
        return [[SYSTEM, *ASK] for _ in range(count)]

    def reward(self, prompt: Any, completion: Completion) -> float:
        assert prompt == [SYSTEM, *ASK], prompt  # the environment's own messages come back
        return character_share(completion.text, frozenset("0123456789"))


def llama3_by_hand(tokenizer: Any, messages: list[Message], generation: bool) -> list[int]:
    """Llama 3's format, special token by special token."""
    special = tokenizer.convert_tokens_to_ids

    def text(value: str) -> list[int]:
        return tokenizer.encode(value, add_special_tokens=False)

    def header(role: str) -> list[int]:
        return [special("<|start_header_id|>"), *text(role), special("<|end_header_id|>")]

    tokens = [special("<|begin_of_text|>")]
    for message in messages:
        tokens += header(message["role"]) + text("\n\n") + text(message["content"])
        tokens.append(special("<|eot_id|>"))
    return tokens + (header("assistant") + text("\n\n") if generation else [])


def chatml_by_hand(tokenizer: Any, messages: list[Message]) -> tuple[list[int], list[float]]:
    """Qwen's ChatML format and its assistant mask, special token by special token."""
    special = tokenizer.convert_tokens_to_ids

    def text(value: str) -> list[int]:
        return tokenizer.encode(value, add_special_tokens=False)

    tokens: list[int] = []
    weights: list[float] = []
    for message in messages:
        header = [special("<|im_start|>"), *text(message["role"] + "\n")]
        body = text(message["content"]) + [special("<|im_end|>")]
        learned = float(message["role"] == "assistant")
        tokens += header + body + text("\n")
        weights += [0.0] * len(header) + [learned] * len(body) + [0.0]
    return tokens, weights
