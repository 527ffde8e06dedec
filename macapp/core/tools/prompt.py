"""How the tools reach the model: Qwen3.5's own tool block, written by the model's chat template, at the head of
the system prompt (rounds.py has how their results come back)."""

from __future__ import annotations

from typing import Sequence

from macapp.core.engine.model_folder import Tokenizer
from macapp.core.serving.requests import ToolSpec
from macapp.core.serving.toolcalls import tool_dicts

SYSTEM_OPEN = "<|im_start|>system\n"
TURN_END = "<|im_end|>"
MARK = "\u2063qwen-desk-system\u2063"  # stands for the user's system prompt while the template is rendered


def tools_system_prompt(tokenizer: Tokenizer, system_prompt: str | None, tools: Sequence[ToolSpec]) -> str | None:
    """The system prompt that offers `tools` (the template's tool block, then the user's own system prompt);
    `system_prompt` itself when there are no tools or the template writes no system block for them."""
    if not tools:
        return system_prompt
    messages = [{"role": "system", "content": MARK}, {"role": "user", "content": "."}]
    text = tokenizer.apply_chat_template(messages, tools=tool_dicts(tools), add_generation_prompt=False, tokenize=False)
    start = text.find(SYSTEM_OPEN)
    end = text.find(TURN_END, start)
    if start < 0 or end < 0 or MARK not in text[start:end]:
        return system_prompt
    body = text[start + len(SYSTEM_OPEN) : end]
    if system_prompt:
        return body.replace(MARK, system_prompt)
    return body.replace(MARK, "").rstrip("\n")
