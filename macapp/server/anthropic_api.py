"""Anthropic Messages: a request body -> CompletionRequest, and the job's events -> a message or its SSE events.

The stream is the real sequence: `message_start`, `ping`, then per block `content_block_start` /
`content_block_delta` (`thinking_delta` then `signature_delta`, `text_delta`, `input_json_delta`) /
`content_block_stop`, then `message_delta` (stop_reason, usage) and `message_stop`. Usage: `input_tokens` counts
the prompt tokens read afresh, `cache_read_input_tokens` the ones restored from a checkpoint. Thinking is on for
`{"type": "enabled", "budget_tokens": N}` (N becomes the engine's thinking budget) and "adaptive". Requests are
read as Claude Code sends them: system messages inside `messages`, a last assistant turn as a prefill,
`tool_reference` results, plain-text documents (tests/server/test_anthropic_clients.py).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from macapp.core.events import AnswerDelta, ReasoningDelta
from macapp.core.serving.requests import (
    ChatMessage,
    Completed,
    CompletionRequest,
    FinishReason,
    ImagePart,
    RequestStarted,
    Role,
    ToolCall,
    ToolCallFinished,
    ToolCallStarted,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
    Usage,
)
from macapp.server import fields as f
from macapp.server.errors import invalid

STOP_REASONS = {
    FinishReason.STOP: "end_turn",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
    FinishReason.TOOL_CALLS: "tool_use",
    FinishReason.CANCELLED: "end_turn",
}
_TOOL_CHOICES = {"auto": ToolChoiceMode.AUTO, "any": ToolChoiceMode.REQUIRED, "tool": ToolChoiceMode.FUNCTION, "none": ToolChoiceMode.NONE}
_SKIPPED_BLOCKS = ("redacted_thinking",)  # opaque to any model but Claude
ERROR_RESULT_PREFIX = "Error: "  # a tool_result with is_error, as the model reads it
# Deferred tools (`defer_loading`) are offered like the others (the prompt stays the same between requests, and
# its checkpoints with it), so a `tool_reference` only tells the model the tool it searched for is there.
TOOL_REFERENCE = "Tool available: "
# Claude Code drops a thinking block (and with it the whole reply) that comes without a signature; nothing here
# verifies one, so every block carries this opaque constant (a signature sent back is ignored).
THINKING_SIGNATURE = "qwen-desk-local-thinking"
# What this server reads of a body; anything else (metadata, context_management, service_tier, ...) is accepted
# and ignored, logged once by name.
USED_FIELDS = frozenset({
    "model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k",
    "tools", "tool_choice", "thinking", "output_config",
})
# thinking.display: "omitted" sends thinking blocks without their text; "summarized", Claude Code's "updates"
# (the thinking-display-updates beta) and any later display send it as it streams.
HIDDEN_THINKING = "omitted"


@dataclass(frozen=True)
class MessagesCall:
    request: CompletionRequest
    stream: bool = False
    show_thinking: bool = True  # thinking.display "omitted": the blocks come back empty


# ------------------------------------------------------------------------------------------------ request


def _system(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid("system must be a string or an array of text blocks.")
    texts = []
    for j, block in enumerate(value):
        block = f.require_object(block, f"system[{j}]")
        if block.get("type") != "text":
            raise invalid(f"system[{j}].type must be 'text'.")
        texts.append(f.get_str(block, "text", f"system[{j}].text", required=True))
    return "\n\n".join(texts)


def _image(block: dict, param: str) -> ImagePart:
    source = f.require_object(block.get("source"), f"{param}.source")
    if source.get("type") != "base64":
        raise invalid(f"{param}.source.type must be 'base64' (the server does not fetch images).")
    return f.decode_image(f.get_str(source, "data", f"{param}.source.data", required=True), source.get("media_type") or "", param)


def _document_text(block: dict, param: str) -> str:
    """A plain-text document (source `text`, or `content` blocks of text), titled as the client named it."""
    source = f.require_object(block.get("source"), f"{param}.source")
    kind = source.get("type")
    if kind == "text":
        body = f.get_str(source, "data", f"{param}.source.data", required=True)
    elif kind == "content":
        body, images = _tool_result_content(source.get("content"), f"{param}.source.content")
        if images:
            raise invalid(f"{param}.source.content: pictures inside a document are not supported; send them as image blocks.")
    else:
        media = source.get("media_type") or kind
        raise invalid(
            f"{param}: {media!r} documents (PDF, files, URLs) are not supported: this server reads plain-text "
            "documents only (source type 'text' or 'content'); send the text instead."
        )
    title = f.get_str(block, "title", f"{param}.title", default="")
    context = f.get_str(block, "context", f"{param}.context", default="")
    return "\n".join(part for part in (title, context, body) if part)


def _tool_result_content(value: Any, param: str) -> tuple[str, tuple[ImagePart, ...]]:
    """A tool_result's text and pictures (Claude Code's Read of a picture file, a screenshot tool): the pictures go
    to the model inside the tool's response, as Qwen3.5's template renders them, on builds that see."""
    if value is None or isinstance(value, str):
        return value or "", ()
    if not isinstance(value, list):
        raise invalid(f"{param} must be a string or an array of blocks.")
    texts, images = [], []
    for j, block in enumerate(value):
        block = f.require_object(block, f"{param}[{j}]")
        if block.get("type") == "text":
            texts.append(f.get_str(block, "text", f"{param}[{j}].text", required=True))
        elif block.get("type") == "document":
            texts.append(_document_text(block, f"{param}[{j}]"))
        elif block.get("type") == "tool_reference":  # Claude Code's ToolSearch found a (deferred) tool
            texts.append(TOOL_REFERENCE + f.get_str(block, "tool_name", f"{param}[{j}].tool_name", required=True))
        elif block.get("type") == "image":
            images.append(_image(block, f"{param}[{j}]"))
        else:
            raise invalid(f"{param}[{j}].type {block.get('type')!r} is not supported in a tool_result.")
    return "\n".join(texts), tuple(images)


def _blocks(value: Any, param: str) -> list[dict]:
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise invalid(f"{param} must be a string or an array of content blocks.")
    return [f.require_object(block, f"{param}[{j}]") for j, block in enumerate(value)]


def _user_turn(blocks: list[dict], param: str, call_names: dict[str, str]) -> list[ChatMessage]:
    """A user turn: its tool results first (one tool message each, in order), then its text and images."""
    results, texts, images = [], [], []
    for j, block in enumerate(blocks):
        where, kind = f"{param}[{j}]", block.get("type")
        if kind == "text":
            texts.append(f.get_str(block, "text", f"{where}.text", required=True))
        elif kind == "document":
            texts.append(_document_text(block, where) + "\n\n")
        elif kind == "image":
            images.append(_image(block, where))
        elif kind == "tool_result":
            call_id = f.get_str(block, "tool_use_id", f"{where}.tool_use_id", required=True)
            text, pictures = _tool_result_content(block.get("content"), f"{where}.content")
            if f.get_bool(block, "is_error", f"{where}.is_error", default=False):
                text = ERROR_RESULT_PREFIX + text  # the template has no error flag: the model reads it in the text
            results.append(ChatMessage(Role.TOOL, text, tool_call_id=call_id, name=call_names.get(call_id), images=pictures))
        elif kind not in _SKIPPED_BLOCKS:
            raise invalid(f"{where}.type {kind!r} is not supported in a user message.")
    if texts or images or not results:
        results.append(ChatMessage(Role.USER, "".join(texts), images=tuple(images)))
    return results


def _assistant_turn(blocks: list[dict], param: str, call_names: dict[str, str]) -> ChatMessage:
    texts, reasoning, calls = [], [], []
    for j, block in enumerate(blocks):
        where, kind = f"{param}[{j}]", block.get("type")
        if kind == "text":
            texts.append(f.get_str(block, "text", f"{where}.text", required=True))
        elif kind == "thinking":
            reasoning.append(f.get_str(block, "thinking", f"{where}.thinking", default=""))
        elif kind == "tool_use":
            call = ToolCall(
                id=f.get_str(block, "id", f"{where}.id", required=True),
                name=f.get_str(block, "name", f"{where}.name", required=True),
                arguments=f.tool_arguments(block.get("input"), f"{where}.input"),
            )
            call_names[call.id] = call.name
            calls.append(call)
        elif kind not in _SKIPPED_BLOCKS:
            raise invalid(f"{where}.type {kind!r} is not supported in an assistant message.")
    return ChatMessage(Role.ASSISTANT, "".join(texts), reasoning="".join(reasoning) or None, tool_calls=tuple(calls))


def parse_messages(body: dict) -> tuple[ChatMessage, ...]:
    raw = f.get_list(body, "messages", "messages", required=True)
    if not raw:
        raise invalid("messages: at least one message is required.")
    system = _system(body.get("system"))
    out = [ChatMessage(Role.SYSTEM, system)] if system else []
    call_names: dict[str, str] = {}
    for i, message in enumerate(raw):
        param = f"messages[{i}]"
        message = f.require_object(message, param)
        role = message.get("role")
        blocks = _blocks(message.get("content"), f"{param}.content")
        if role == "user":
            out.extend(_user_turn(blocks, f"{param}.content", call_names))
        elif role == "assistant":
            out.append(_assistant_turn(blocks, f"{param}.content", call_names))
        elif role == "system":  # Claude Code (2.1.154 on) sends hook context so; rendered in place (render.py)
            out.append(ChatMessage(Role.SYSTEM, _system(blocks)))
        else:
            raise invalid(f"{param}.role {role!r} is not 'user', 'assistant' or 'system'.")
    if all(m.role is Role.SYSTEM for m in out):
        raise invalid("messages: at least one user or assistant message is required (the system prompt is not one).")
    return tuple(out)


def parse_tools(value: Any) -> tuple[ToolSpec, ...]:
    specs = []
    for j, tool in enumerate(f.get_list({"tools": value}, "tools", "tools")):
        where = f"tools[{j}]"
        tool = f.require_object(tool, where)
        if tool.get("type", "custom") != "custom" or "input_schema" not in tool:
            raise invalid(f"{where}: only custom tools with an input_schema are supported (not {tool.get('type')!r}).")
        specs.append(ToolSpec(
            name=f.get_str(tool, "name", f"{where}.name", required=True),
            description=f.get_str(tool, "description", f"{where}.description", default=""),
            parameters=f.get_object(tool, "input_schema", f"{where}.input_schema"),
        ))
    return tuple(specs)


def parse_tool_choice(value: Any, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    if value is None:
        return ToolChoice()
    choice = f.require_object(value, "tool_choice")
    mode = _TOOL_CHOICES.get(choice.get("type"))
    if mode is None:
        raise invalid(f"tool_choice.type {choice.get('type')!r} is not 'auto', 'any', 'tool' or 'none'.")
    parallel = not f.get_bool(choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use", default=False)
    if mode is not ToolChoiceMode.FUNCTION:
        return ToolChoice(mode, parallel=parallel)
    name = f.get_str(choice, "name", "tool_choice.name", required=True)
    if name not in {t.name for t in tools}:
        raise invalid(f"tool_choice names {name!r}, which is not in tools.")
    return ToolChoice(mode, name, parallel)


@dataclass(frozen=True)
class Thinking:
    on: bool = False
    budget: int | None = None  # the engine's thinking budget; None: the engine's own
    shown: bool = True  # display "omitted": thinking blocks come back with no text


def parse_thinking(body: dict) -> Thinking:
    """On for {"type": "enabled", "budget_tokens": N} and "adaptive" (no budget); off when absent, "disabled" or
    "between_tools" (thinking off; this model writes no progress notes between calls)."""
    thinking = f.get_object(body, "thinking", "thinking")
    kind = thinking.get("type")
    shown = f.get_str(thinking, "display", "thinking.display", default="summarized") != HIDDEN_THINKING
    if (kind is None and not thinking) or kind in ("disabled", "between_tools"):
        return Thinking(shown=shown)
    if kind == "enabled":
        return Thinking(True, f.get_int(thinking, "budget_tokens", "thinking.budget_tokens", minimum=0), shown)
    if kind == "adaptive":
        return Thinking(True, None, shown)
    raise invalid(f"thinking.type {kind!r} is not 'enabled', 'adaptive', 'disabled' or 'between_tools'.")


def parse_messages_request(body: dict, client: str = "", for_counting: bool = False) -> MessagesCall:
    f.note_ignored(body, USED_FIELDS, "anthropic")
    messages = parse_messages(body)
    thinking = parse_thinking(body)
    _refuse_unsupported(body)
    max_tokens = f.get_int(body, "max_tokens", "max_tokens", minimum=1)
    if max_tokens is None and not for_counting:
        raise invalid("max_tokens is required.")
    sampling = f.sampling_for(
        thinking.on, max_tokens,
        temperature=f.get_float(body, "temperature", "temperature", 0, 1),
        top_p=f.get_float(body, "top_p", "top_p", 0, 1),
        top_k=f.get_int(body, "top_k", "top_k", minimum=0),
    )
    tools = parse_tools(body.get("tools"))
    request = CompletionRequest(
        messages=messages, sampling=sampling, thinking=thinking.on, thinking_budget=thinking.budget, tools=tools,
        tool_choice=parse_tool_choice(body.get("tool_choice"), tools),
        stop=f.stop_sequences(body.get("stop_sequences"), "stop_sequences"), client=client,
        continue_reply=messages[-1].role is Role.ASSISTANT,  # a prefill: the reply goes on from it
    )
    return MessagesCall(request, stream=bool(f.get_bool(body, "stream", "stream", default=False)), show_thinking=thinking.shown)


def _refuse_unsupported(body: dict) -> None:
    """What silently ignored would hand the client something else than it asked for (effort is only a hint)."""
    output = f.get_object(body, "output_config", "output_config")
    if output.get("format") is not None:
        raise invalid("output_config.format (structured outputs) is not supported: ask for JSON in the prompt.")


# ------------------------------------------------------------------------------------------------ reply


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.read_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def message_body(done: Completed, message_id: str, model: str, show_thinking: bool = True) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if done.reasoning:
        content.append({"type": "thinking", "thinking": done.reasoning if show_thinking else "", "signature": THINKING_SIGNATURE})
    if done.text:
        content.append({"type": "text", "text": done.text})
    content.extend({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in done.tool_calls)
    return {
        "id": message_id, "type": "message", "role": "assistant", "model": done.model or model, "content": content,
        "stop_reason": STOP_REASONS[done.finish_reason], "stop_sequence": done.stop_sequence, "usage": usage_body(done.usage),
    }


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


@dataclass
class EventWriter:
    """Turns a job's events into Anthropic stream events (name, data), keeping track of the open block."""

    model: str
    prompt_tokens: int = 0  # message_start's usage if the job ends before it starts (stopped while queued)
    show_thinking: bool = True  # False: thinking blocks open and close with no thinking_delta
    id: str = field(default_factory=new_message_id)
    _index: int = -1
    _open: str | None = None  # "thinking" | "text" | "tool_use"
    _started: bool = False  # message_start written

    @property
    def started(self) -> bool:
        """message_start is written."""
        return self._started

    def start(self, usage: Usage | None = None) -> list[tuple[str, dict[str, Any]]]:
        """message_start (with the prompt's read/reused split once the engine has it) and a ping; once only."""
        if self._started:
            return []
        self._started = True
        message = {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": usage_body(usage or Usage(prompt_tokens=self.prompt_tokens)),
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self._open is None:
            return []
        out = [self._delta({"type": "signature_delta", "signature": THINKING_SIGNATURE})] if self._open == "thinking" else []
        self._open = None
        return [*out, ("content_block_stop", {"type": "content_block_stop", "index": self._index})]

    def _begin(self, kind: str, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out = self._close()
        self._index += 1
        self._open = kind
        return [*out, ("content_block_start", {"type": "content_block_start", "index": self._index, "content_block": block})]

    def _delta(self, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}

    def events(self, event: Any) -> list[tuple[str, dict[str, Any]]]:
        """The stream events for one job event. message_start waits for RequestStarted, the job's first event once
        the engine takes the request, so its usage already says how much of the prompt is read and how much reused
        (Claude Code reads it there); until then the route sends SSE comments as keep-alives."""
        if isinstance(event, RequestStarted):
            return self.start(Usage(prompt_tokens=event.prompt_tokens, cached_tokens=event.cached_tokens))
        out = self._block_events(event)
        return self.start() + out if out else out

    def _block_events(self, event: Any) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        match event:
            case ReasoningDelta(text=text) if text:
                if self._open != "thinking":
                    out += self._begin("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                if self.show_thinking:
                    out.append(self._delta({"type": "thinking_delta", "thinking": text}))
            case AnswerDelta(text=text) if text:
                if self._open != "text":
                    out += self._begin("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": text}))
            case ToolCallStarted(id=call_id, name=name):
                out += self._begin("tool_use", {"type": "tool_use", "id": call_id, "name": name, "input": {}})
            case ToolCallFinished(call=call):
                out.append(self._delta({"type": "input_json_delta", "partial_json": json.dumps(call.arguments, ensure_ascii=False)}))
                out += self._close()
            case Completed():
                out += self._close()
                delta = {"stop_reason": STOP_REASONS[event.finish_reason], "stop_sequence": event.stop_sequence}
                out.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage_body(event.usage)}))
                out.append(("message_stop", {"type": "message_stop"}))
        return out
