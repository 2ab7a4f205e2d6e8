"""Renderers: chat messages <-> token ids, with the mask of the tokens the model learns and
the stop tokens of an assistant turn (`whitney.renderers.base.Renderer`).

    raw             no markup: BOS + text; an assistant turn is its text + EOS (`local/*`)
    chat_template   the model's own chat template (`apply_chat_template` of its tokenizer)
    llama3          Llama 3's format, explicit
    qwen            Qwen's ChatML format, explicit

`get_renderer(name, tokenizer, base_model)` picks one; `auto` is raw for `local/*` models,
the chat template for a tokenizer that has one, else raw. `Transcript` renders a multi-turn
episode turn by turn. Pure Python; no torch.
"""

from __future__ import annotations

from typing import Literal

from whitney.renderers.base import (
    Message,
    Prompt,
    Rendered,
    Renderer,
    as_messages,
    check_messages,
)
from whitney.renderers.chat_template import ChatTemplateRenderer
from whitney.renderers.llama3 import Llama3Renderer
from whitney.renderers.qwen import QwenRenderer
from whitney.renderers.raw import RawRenderer
from whitney.renderers.transcript import Transcript
from whitney.tokenizers import LOCAL_PREFIX, Tokenizer

RENDERERS: dict[str, type[Renderer]] = {
    renderer.name: renderer
    for renderer in (RawRenderer, ChatTemplateRenderer, Llama3Renderer, QwenRenderer)
}
RendererName = Literal["auto", "raw", "chat_template", "llama3", "qwen"]
"""The `renderer` setting of a flow: a renderer by name, or `auto`."""
AUTO = "auto"


def auto_renderer(base_model: str, tokenizer: Tokenizer) -> str:
    """The renderer `auto` picks: raw for `local/*`, else the chat template if there is one."""
    if base_model.startswith(LOCAL_PREFIX) or not getattr(tokenizer, "chat_template", None):
        return RawRenderer.name
    return ChatTemplateRenderer.name


def get_renderer(name: str, tokenizer: Tokenizer, base_model: str) -> Renderer:
    """The renderer `name` (or `auto`) on `tokenizer`; ValueError if unknown or if the
    tokenizer lacks what it needs (a special token, a chat template)."""
    chosen = auto_renderer(base_model, tokenizer) if name == AUTO else name
    renderer = RENDERERS.get(chosen)
    if renderer is None:
        raise ValueError(f"unknown renderer {name!r} (known: {AUTO}, {', '.join(RENDERERS)})")
    return renderer(tokenizer)


__all__ = [
    "AUTO",
    "RENDERERS",
    "ChatTemplateRenderer",
    "Llama3Renderer",
    "Message",
    "Prompt",
    "QwenRenderer",
    "RawRenderer",
    "Rendered",
    "Renderer",
    "RendererName",
    "Transcript",
    "as_messages",
    "auto_renderer",
    "check_messages",
    "get_renderer",
]
