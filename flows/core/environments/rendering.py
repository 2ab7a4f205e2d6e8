"""A flow's tokenizer and renderer, from its config's `base_model`, `tokenizer` and
`renderer` (whitney.tokenizers, whitney.renderers), with a ConfigError naming the field that
cannot be resolved. No Prefect: plans call it before anything is allocated."""

from __future__ import annotations

from flows.core.config import ConfigError, FlowConfig
from whitney.renderers import Renderer, get_renderer
from whitney.tokenizers import get_tokenizer


def load_renderer(
    base_model: str,
    tokenizer: str | None,
    renderer: str,
    fields: tuple[str, str, str] = ("base_model", "tokenizer", "renderer"),
) -> Renderer:
    """The renderer `renderer` on the tokenizer of `base_model` (or `tokenizer`); ConfigError
    naming the field among `fields` (base model, tokenizer, renderer) that is at fault."""
    try:
        resolved = get_tokenizer(base_model, tokenizer)
    except ValueError as error:
        raise ConfigError(fields[1] if tokenizer else fields[0], str(error)) from None
    try:
        return get_renderer(renderer, resolved, base_model)
    except ValueError as error:
        raise ConfigError(fields[2], str(error)) from None


def config_renderer(config: FlowConfig) -> Renderer:
    """The renderer of a flow's config (its base model's tokenizer, or its `tokenizer`)."""
    return load_renderer(config.base_model, config.tokenizer, config.renderer)
