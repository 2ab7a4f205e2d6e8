"""What the flow tests on Hugging Face checkpoints share: chat data and an environment whose
prompts are messages (loaded by import path `flowtest_hf:...`)."""

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
