"""The tool results as the next round's message: what Qwen3.5's template writes for `tool` messages (one user turn
of ``<tool_response>`` blocks), sent with the session's own `send`, so that a round reads only them (prompt reuse).
Pure text, no MLX: the conversation model reads `has_tool_rounds` too."""

from __future__ import annotations

from typing import Mapping, Sequence

RESPONSE_OPEN = "<tool_response>"


def has_tool_rounds(messages: Sequence[Mapping[str, object]]) -> bool:
    """Whether the last exchange of a session's `messages` holds tool rounds (a user message of tool results)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return str(message.get("content") or "").startswith(RESPONSE_OPEN)
    return False


def tool_responses(results: Sequence[str]) -> str:
    """The next round's message: each result (already made safe: results.for_prompt) in a <tool_response> block."""
    return "\n".join(f"{RESPONSE_OPEN}\n{r}\n</tool_response>" for r in results)
