"""The longest context a model takes, and the one rule every command applies to a context asked for.

`fit`, `chat`, `serve` and the window all refuse a context above the model's maximum with the same message.
The maximum is a function of the model's config alone, so reading more of the config (YaRN's rope scaling, for
contexts past the native length) changes it here and everywhere at once.
"""

from __future__ import annotations

from typing import Any

from macapp.core.modelfiles import text_config

NATIVE_DEFAULT = 262_144  # Qwen3.5's native length, for a config that does not say


class ContextError(ValueError):
    """A context length no model or no such model takes; the message says which and why."""


def longest_context(config: dict[str, Any]) -> int:
    """The most tokens a model with this config.json (or its text_config) takes: its max_position_embeddings."""
    value = text_config(config).get("max_position_embeddings", NATIVE_DEFAULT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value <= 0:
        raise ContextError(f"config field 'max_position_embeddings' must be a positive whole number, not {value!r}")
    return int(value)


def check_context(context: int, longest: int, model_name: str) -> None:
    """ContextError unless 1 ≤ context ≤ the model's longest context."""
    if context <= 0:
        raise ContextError(f"context must be at least 1 token, not {context}")
    if context > longest:
        raise ContextError(f"context {context:,} is above {model_name}'s maximum of {longest:,} tokens")
