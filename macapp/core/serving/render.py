"""A CompletionRequest as prompt tokens, through the model's own chat template (pure Python; no MLX).

- Messages go to the template in the shape Qwen3.5's expects: assistant tool calls with their arguments as a
  mapping (the template iterates ``arguments|items``), tool results as ``tool`` messages (the template groups
  them into one user turn of ``<tool_response>`` blocks), an assistant turn's earlier reasoning as
  ``reasoning_content`` (the template keeps it only after the last user query). ``enable_thinking`` is
  always passed explicitly. One system message, first: leading ones are joined, later ones become user turns.
- Tool choice: AUTO offers the tools; NONE does not offer them (and no call is parsed); REQUIRED and FUNCTION
  offer them and prefill the reply's opening after the generation prompt — ``<tool_call>\\n<function=`` for
  REQUIRED, ``<tool_call>\\n<function=NAME>\\n`` for FUNCTION — so the model can only go on writing a call.
  A forced call is written without reasoning (the prompt closes the think block, as with thinking off):
  a prefill cannot wait for the end of a reasoning the model has not written yet.
- Continuing a reply (Anthropic's prefill: the request ends with an assistant turn): the turns before it are
  rendered and its text is written after the generation prompt, like a forced call's opening (same rules).
- A thinking budget of 0 is thinking off (the template's own empty think block, so the prompt is the same
  as a thinking-off request's and shares its checkpoints).
- Checkpoint boundaries (where the pool may keep a cache snapshot): the start of every turn after the system
  prompt and tools (the generation prompt's included: "before the reply"); inside a turn the end of each content
  block an agent repeats (``</system-reminder>``, ``</tool_response>``: Claude Code's first message opens with
  some 8,000 tokens of reminders that the next session sends again before other words); every PERIOD tokens
  (a long read is resumable within a few thousand tokens of where two prompts part); and the prompt's last token.
  Every turn starts with the special token ``<|im_start|>``, which the tokenizer never merges with its
  neighbours, so the tokens before a turn start depend only on the text before it: the same conversation prefix
  in a later request has the very same tokens up to there. A block end is placed after the last token that ends
  at or before it in the text (the tokenizer's offsets); the pool compares tokens, so a boundary that lands
  differently in another prompt only misses, it is never reused wrongly.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Sequence

from macapp.core.engine.model_folder import Tokenizer
from macapp.core.picture_data import ImagePart
from macapp.core.serving.requests import ChatMessage, CompletionRequest, Role, ToolChoiceMode, ToolSpec
from macapp.core.serving.toolcalls import OPEN, tool_dicts

TURN_START = "<|im_start|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
BLOCK_ENDS = ("</system-reminder>", "</tool_response>")  # content blocks an agent sends again in its next session
PERIOD = 4096  # a checkpoint every this many tokens of a long read, at whole multiples (the same in every prompt)


class RenderError(ValueError):
    """The request cannot be rendered; the message says why, for the client."""


@dataclass(frozen=True)
class RenderedPrompt:
    tokens: list[int]
    boundaries: tuple[int, ...]  # ascending token offsets (0 < b < len(tokens)) worth a cache checkpoint
    thinking: bool  # the reply starts inside the reasoning (the prompt opened a think block)
    prefill: str  # reply text the prompt already wrote (a forced call's opening), "" usually
    tools: tuple[ToolSpec, ...]  # the tools offered to the model (none with ToolChoiceMode.NONE)
    text: str  # the prompt as text (for logs and tests)
    images: tuple[ImagePart, ...] = ()  # the pictures the prompt's image placeholders stand for, in order


def template_message(message: ChatMessage) -> dict[str, object]:
    """One message in the shape chat templates read."""
    content: str | list[dict[str, str]] = message.content
    if message.images:  # Qwen3.5's template writes one vision block per image (or video) part, then the text
        content = [{"type": "video" if image.is_video else "image"} for image in message.images] + [{"type": "text", "text": message.content}]
    out: dict[str, object] = {"role": message.role.value, "content": content}
    if message.role is Role.ASSISTANT:
        if message.reasoning is not None:
            out["reasoning_content"] = message.reasoning
        if message.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}} for c in message.tool_calls]
    elif message.role is Role.TOOL:
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            out["name"] = message.name
    return out


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, object]]:
    """The messages as the template takes them. Qwen3.5's takes one system message, first ("System message must be
    at the beginning"); clients send more: a system and a developer message together (joined into one), Claude
    Code's hook context as a system message after the first user turn, a late developer message (those become
    user turns, in place: moving them into the first would change the prompt's start, and its checkpoints)."""
    leading = 0
    while leading < len(messages) and messages[leading].role is Role.SYSTEM:
        leading += 1
    head = [ChatMessage(Role.SYSTEM, "\n\n".join(m.content for m in messages[:leading] if m.content))] if leading else []
    rest = [replace(m, role=Role.USER) if m.role is Role.SYSTEM else m for m in messages[leading:]]
    return [template_message(m) for m in head + rest]


def offered_tools(request: CompletionRequest) -> tuple[ToolSpec, ...]:
    """The tools the prompt lists: none for ToolChoiceMode.NONE, only the allowed ones when the choice names them."""
    choice = request.tool_choice
    if choice.mode is ToolChoiceMode.NONE:
        return ()
    return tuple(t for t in request.tools if choice.allowed is None or t.name in choice.allowed)


def forced_prefill(request: CompletionRequest) -> str:
    """The reply's opening the prompt writes for a forced tool choice ("" when the model chooses)."""
    choice = request.tool_choice
    if choice.mode is ToolChoiceMode.REQUIRED:
        if not offered_tools(request):
            raise RenderError("tool_choice requires a tool call, but the request offers no tools.")
        return OPEN + "\n<function="
    if choice.mode is ToolChoiceMode.FUNCTION:
        if choice.name not in {t.name for t in request.tools}:
            raise RenderError(f"tool_choice names the function {choice.name!r}, which is not among the request's tools.")
        return f"{OPEN}\n<function={choice.name}>\n"
    return ""


def continued_reply(request: CompletionRequest) -> tuple[tuple[ChatMessage, ...], str]:
    """(the messages to render, the reply's start the prompt already writes): with `continue_reply`, a last
    assistant turn without calls is not a finished turn but the opening of this reply, written after the
    generation prompt; the reply that comes back is what follows it."""
    last = request.messages[-1]
    if not request.continue_reply or last.role is not Role.ASSISTANT or last.tool_calls:
        return request.messages, ""
    if len(request.messages) == 1:
        raise RenderError("The reply to go on with (the last assistant message) needs a user message before it.")
    return request.messages[:-1], last.content


def _check(request: CompletionRequest) -> None:
    if not request.messages:
        raise RenderError("The request has no messages.")


def render(tokenizer: Tokenizer, request: CompletionRequest) -> RenderedPrompt:
    """The prompt of `request` through `tokenizer`'s chat template (an mlx-lm TokenizerWrapper or HF tokenizer)."""
    text, prefill, tools = _template_text(tokenizer, request)
    tokens, ends = _encode(tokenizer, text)
    gen_prompt = text[text.rfind(TURN_START) :]
    in_reasoning = THINK_OPEN in gen_prompt and THINK_CLOSE not in gen_prompt.rsplit(THINK_OPEN, 1)[1]
    images = tuple(image for m in request.messages for image in m.images)
    return RenderedPrompt(tokens, boundaries(tokenizer, text, tokens, ends), in_reasoning, prefill, tools, text, images)


def _encode(tokenizer: Tokenizer, text: str) -> tuple[list[int], list[int] | None]:
    """The tokens of `text`, and where each ends in it (None where the tokenizer gives no offsets: a slow one)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a Hugging Face fast tokenizer's (mlx-lm's wrapper hands it on)
    if backend is None:
        return list(tokenizer.encode(text, add_special_tokens=False)), None
    encoding = backend.encode(text, add_special_tokens=False)
    return list(encoding.ids), [end for _, end in encoding.offsets]


def render_text(tokenizer: Tokenizer, request: CompletionRequest) -> str:
    """The prompt as text, not tokenized (what render tokenizes; for bounds.prompt_exceeds)."""
    return _template_text(tokenizer, request)[0]


def _template_text(tokenizer: Tokenizer, request: CompletionRequest) -> tuple[str, str, tuple[ToolSpec, ...]]:
    _check(request)
    messages, started = continued_reply(request)
    prefill = started + forced_prefill(request)
    tools = offered_tools(request)
    thinking = request.thinking and request.thinking_budget != 0 and not prefill
    try:
        text = tokenizer.apply_chat_template(
            template_messages(messages),
            tools=tool_dicts(tools) or None,
            add_generation_prompt=True,
            enable_thinking=thinking,
            tokenize=False,
        )
    except Exception as exc:  # the template's own raise_exception, or a shape it cannot read
        raise RenderError(f"The model's chat template cannot render these messages: {exc}") from exc
    return text + prefill, prefill, tools


def boundaries(tokenizer: Tokenizer, text: str, tokens: Sequence[int], ends: Sequence[int] | None = None) -> tuple[int, ...]:
    """Checkpoint offsets (the module docstring): turn starts after the system turn, content-block ends (with the
    tokens' end offsets in `text`), every PERIOD tokens, before the last token."""
    start_id = tokenizer.convert_tokens_to_ids(TURN_START)
    token_starts = [i for i, t in enumerate(tokens) if t == start_id]
    text_starts = _all(text, TURN_START)
    found = {len(tokens) - 1, *range(PERIOD, len(tokens), PERIOD)}
    if len(token_starts) == len(text_starts):  # else the turn starts cannot be told apart: the end only
        roles = [text[i + len(TURN_START) :].split("\n", 1)[0].strip() for i in text_starts]
        first = 1 if roles and roles[0] == "system" else 0
        found.update(token_starts[first:])
    if ends is not None and len(ends) == len(tokens):
        for marker in BLOCK_ENDS:
            found.update(bisect.bisect_right(ends, at + len(marker)) for at in _all(text, marker))
    return tuple(sorted(b for b in found if 0 < b < len(tokens)))


def _all(text: str, marker: str) -> list[int]:
    found, at = [], text.find(marker)
    while at >= 0:
        found.append(at)
        at = text.find(marker, at + 1)
    return found
