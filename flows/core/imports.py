"""Plug-ins by import path: `package.module:attribute`."""

from __future__ import annotations

import importlib
from collections.abc import Mapping


def import_object(path: str) -> object:
    """The object at `module:attr`; ValueError saying what is wrong otherwise."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{path!r} is not an import path of the form module:attr")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import {module_name!r}: {error}") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None


def import_registered(registry: Mapping[str, str], name: str, unknown: str) -> tuple[str, object]:
    """(import path, object) of the plug-in registered as `name` in `registry` (name -> import
    path), or at import path `name`; ValueError `unknown`, with the registered names, if neither."""
    path = registry.get(name, name)
    if ":" not in path:
        raise ValueError(
            f"{unknown} (built-in: {', '.join(registry)}; or an import path module:attr)"
        )
    return path, import_object(path)
