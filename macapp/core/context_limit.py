"""The longest context a model takes, and the one rule every command applies to a context asked for.

`fit`, `chat`, `serve` and the window all refuse a context above the model's maximum with the same message.
The maximum is a function of the model's config alone: its native max_position_embeddings, or past it the
YaRN limit (macapp.core.long_context) where the model's rope allows YaRN.
"""

from __future__ import annotations

from macapp.core.jsonvalue import JSONObject
from macapp.core.long_context import RopeInfo, rope_info
from macapp.core.modelfiles import text_config

NATIVE_DEFAULT = 262_144  # Qwen3.5's native length, for a config that does not say


class ContextError(ValueError):
    """A context length no model or no such model takes; the message says which and why."""


def native_context(config: JSONObject) -> int:
    """The config's own max_position_embeddings (its native length unless the config already carries YaRN)."""
    value = text_config(config).get("max_position_embeddings", NATIVE_DEFAULT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value <= 0:
        raise ContextError(f"config field 'max_position_embeddings' must be a positive whole number, not {value!r}")
    return int(value)


def rope_of(config: JSONObject) -> RopeInfo:
    """The native length and YaRN facts of a config.json (or its text_config)."""
    return rope_info(config, native_context(config))


def longest_context(config: JSONObject) -> int:
    """The most tokens a model with this config.json (or its text_config) takes: past its native length with
    YaRN where its rope allows it (macapp.core.long_context), else its max_position_embeddings."""
    return rope_of(config).longest


def check_context(context: int, longest: int, model_name: str, native: int | None = None, no_yarn: str | None = None) -> None:
    """ContextError unless 1 ≤ context ≤ the model's longest context; `native` and `no_yarn` (why YaRN cannot
    extend it) make the message say whether long-context mode was the way and why it is not."""
    if context <= 0:
        raise ContextError(f"context must be at least 1 token, not {context}")
    if context <= longest:
        return
    if no_yarn and native is not None and longest <= native:
        raise ContextError(f"context {context:,} is above {model_name}'s native {native:,} tokens, and long-context mode (YaRN) cannot extend it: {no_yarn}")
    if native is not None and longest > native:
        raise ContextError(
            f"context {context:,} is above {model_name}'s maximum of {longest:,} tokens ({native:,} native, {longest:,} with YaRN long-context mode)"
        )
    raise ContextError(f"context {context:,} is above {model_name}'s maximum of {longest:,} tokens")


def check_config_context(context: int, config: JSONObject, model_name: str) -> None:
    """check_context for a config.json: the rule `chat`, `serve` and the loader apply."""
    info = rope_of(config)
    check_context(context, info.longest, model_name, info.native, info.no_yarn_reason)
