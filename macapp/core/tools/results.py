"""A tool's result as the text the model reads: its content joined, cut to RESULT_LIMIT bytes with a note, and
the chat template's special tokens made plain text so that no result can close or open a turn of the prompt."""

from __future__ import annotations

import json
from typing import Callable, Iterable

RESULT_LIMIT = 256 * 1024  # bytes of UTF-8, the note included
ZERO_WIDTH = "\u200b"

# The markup of Qwen3.5's template and tool format; each gets a zero-width space after its "<", so the tokenizer
# reads it as ordinary text (the model still sees what it says).
SPECIAL = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)


def content_text(parts: Iterable[object], structured: object = None) -> str:
    """The text of an MCP result's content: text parts as they are, other parts (pictures, resources) named; the
    structured content as JSON when there is no text."""
    out: list[str] = []
    for part in parts:
        kind = getattr(part, "type", "")
        if kind == "text":
            out.append(str(getattr(part, "text", "")))
        elif kind == "resource":
            resource = getattr(part, "resource", None)
            text = getattr(resource, "text", None)
            out.append(str(text) if text is not None else f"[resource {getattr(resource, 'uri', '')}]")
        else:
            out.append(f"[{kind or 'content'} {getattr(part, 'mime_type', '') or ''}]".replace(" ]", "]"))
    if not out and structured is not None:
        out.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(out)


def cut(text: str, limit: int = RESULT_LIMIT, why: str = "the tool's full result is too large for the prompt") -> str:
    """`text`, or its start and a note saying how much was left out (and `why`), within `limit` bytes of UTF-8."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    note = f"\n[result cut: {len(data)} bytes, the first {{}} shown; {why}]"
    keep = max(limit - len(note.encode("utf-8")) - 16, 0)
    head = data[:keep].decode("utf-8", errors="ignore")
    return head + note.format(len(head.encode("utf-8")))


FIT_WHY = "the rest does not fit what is left of the context"


def fit(text: str, count: Callable[[str], int], room: int) -> str:
    """`text` for the prompt (for_prompt's), cut further until `count` says it takes at most `room` tokens, with a
    note; a result with no room at all is the note alone."""
    full = defuse(text)
    text = cut(full)
    for _ in range(8):
        tokens = count(text)
        if tokens <= room:
            return text
        size = len(text.encode("utf-8"))
        text = cut(full, max(int(size * room / tokens * 0.9), 0), FIT_WHY)
    return cut(full, 0, FIT_WHY)


def defuse(text: str) -> str:
    """`text` with every special token of the template broken up (a zero-width space after its '<')."""
    for token in SPECIAL:
        if token in text:
            text = text.replace(token, token[0] + ZERO_WIDTH + token[1:])
    return text


def for_prompt(text: str) -> str:
    """A result as it goes into the prompt: defused, then cut."""
    return cut(defuse(text))
