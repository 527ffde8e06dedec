"""OpenAI chat completions: a request body -> CompletionRequest, and the job's events -> a completion or its chunks.

Reasoning goes out in `reasoning_content` (message and delta), never in `content`; tool calls as `tool_calls`
entries (`id`, `type: function`, `function.name`, `function.arguments` as a JSON string) with `finish_reason:
"tool_calls"`; usage with `prompt_tokens_details.cached_tokens` (prompt tokens restored from a checkpoint).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from macapp.core.events import AnswerDelta, ReasoningDelta
from macapp.core.serving.requests import (
    ChatMessage,
    Completed,
    CompletionRequest,
    FinishReason,
    ImagePart,
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

ROLES = {"system": Role.SYSTEM, "developer": Role.SYSTEM, "user": Role.USER, "assistant": Role.ASSISTANT, "tool": Role.TOOL}
FINISH_REASONS = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.TOOL_CALLS: "tool_calls",
    FinishReason.CANCELLED: "stop",
}
_TEXT_PARTS = ("text", "input_text")
USED_FIELDS = frozenset({
    "messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "logit_bias", "n", "logprobs", "functions",
    "function_call", "response_format", "tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options",
    "stop", "chat_template_kwargs", "reasoning_effort",
})


@dataclass(frozen=True)
class ChatCompletionCall:
    request: CompletionRequest
    stream: bool = False
    include_usage: bool = False


# ------------------------------------------------------------------------------------------------ request


def _content(value: Any, param: str) -> tuple[str, tuple[ImagePart, ...]]:
    """Text and images of a message's `content`: a string, null, or a list of content parts."""
    if value is None:
        return "", ()
    if isinstance(value, str):
        return value, ()
    if not isinstance(value, list):
        raise invalid(f"{param} must be a string or an array of content parts.", param=param)
    texts: list[str] = []
    images: list[ImagePart] = []
    for j, part in enumerate(value):
        where = f"{param}[{j}]"
        part = f.require_object(part, where)
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            texts.append(f.get_str(part, "text", f"{where}.text", required=True))
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            images.append(f.image_from_url(url, f"{where}.image_url.url"))
        else:
            raise invalid(f"{where}.type {kind!r} is not supported (use 'text' or 'image_url').", param=f"{where}.type")
    return "".join(texts), tuple(images)


def _tool_calls(value: Any, param: str) -> tuple[ToolCall, ...]:
    if not isinstance(value, list):
        raise invalid(f"{param} must be an array.", param=param)
    calls = []
    for j, item in enumerate(value):
        where = f"{param}[{j}]"
        item = f.require_object(item, where)
        function = f.require_object(item.get("function"), f"{where}.function")
        name = f.get_str(function, "name", f"{where}.function.name", required=True)
        arguments = f.tool_arguments(function.get("arguments"), f"{where}.function.arguments")
        calls.append(ToolCall(id=f.get_str(item, "id", f"{where}.id", default="") or f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=arguments))
    return tuple(calls)


def parse_message(index: int, value: Any) -> ChatMessage:
    param = f"messages[{index}]"
    message = f.require_object(value, param)
    role_name = message.get("role")
    if role_name not in ROLES:
        raise invalid(
            f"{param}.role {role_name!r} is not one of 'system', 'developer', 'user', 'assistant', 'tool'.",
            param=f"{param}.role",
        )
    role = ROLES[role_name]
    text, images = _content(message.get("content"), f"{param}.content")
    if images and role in (Role.SYSTEM, Role.ASSISTANT):  # the template has no place for them: never dropped silently
        raise invalid(f"{param}: pictures go in user (or tool) messages, not in a {role_name} message.", param=f"{param}.content")
    if role is Role.ASSISTANT:
        reasoning = f.get_str(message, "reasoning_content", f"{param}.reasoning_content") or f.get_str(message, "reasoning", f"{param}.reasoning")
        calls = _tool_calls(message.get("tool_calls") or [], f"{param}.tool_calls")
        return ChatMessage(role, text, reasoning=reasoning, tool_calls=calls)
    if role is Role.TOOL:
        call_id = f.get_str(message, "tool_call_id", f"{param}.tool_call_id")
        return ChatMessage(role, text, tool_call_id=call_id, name=f.get_str(message, "name", f"{param}.name"), images=images)
    return ChatMessage(role, text, images=images)


def parse_tools(value: Any) -> tuple[ToolSpec, ...]:
    specs = []
    for j, item in enumerate(f.get_list({"tools": value}, "tools", "tools")):
        where = f"tools[{j}]"
        item = f.require_object(item, where)
        if item.get("type", "function") != "function":
            raise invalid(f"{where}.type {item.get('type')!r} is not supported (only 'function').", param=f"{where}.type")
        function = f.require_object(item.get("function"), f"{where}.function")
        specs.append(ToolSpec(
            name=f.get_str(function, "name", f"{where}.function.name", required=True),
            description=f.get_str(function, "description", f"{where}.function.description", default=""),
            parameters=f.get_object(function, "parameters", f"{where}.function.parameters"),
        ))
    return tuple(specs)


def parse_tool_choice(value: Any, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    if value is None:
        return ToolChoice()
    if isinstance(value, str):
        try:
            mode = ToolChoiceMode(value)
        except ValueError:
            raise invalid(f"tool_choice {value!r} is not 'auto', 'none', 'required' or a named function.", param="tool_choice") from None
        if mode is ToolChoiceMode.FUNCTION:
            raise invalid("tool_choice 'function' needs the function's name: {\"type\": \"function\", \"function\": {\"name\": ...}}.", param="tool_choice")
        return ToolChoice(mode)
    choice = f.require_object(value, "tool_choice")
    if choice.get("type") == "allowed_tools":
        return _allowed_tools(choice, tools)
    if choice.get("type", "function") != "function":
        raise invalid(f"tool_choice type {choice.get('type')!r} is not supported (only 'function' and 'allowed_tools').", param="tool_choice.type")
    function = f.require_object(choice.get("function"), "tool_choice.function")
    name = f.get_str(function, "name", "tool_choice.function.name", required=True)
    if name not in {t.name for t in tools}:
        raise invalid(f"tool_choice names {name!r}, which is not in tools.", param="tool_choice.function.name")
    return ToolChoice(ToolChoiceMode.FUNCTION, name)


def _allowed_tools(choice: dict, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    """{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools": [{"type": "function",
    "function": {"name": ...}}]}}: the model may call only those (`ToolChoice.allowed`; the others are not offered)."""
    allowed = f.require_object(choice.get("allowed_tools"), "tool_choice.allowed_tools")
    mode = {"auto": ToolChoiceMode.AUTO, "required": ToolChoiceMode.REQUIRED}.get(allowed.get("mode"))
    if mode is None:
        raise invalid(f"tool_choice.allowed_tools.mode {allowed.get('mode')!r} is not 'auto' or 'required'.", param="tool_choice.allowed_tools.mode")
    names = []
    for j, item in enumerate(f.get_list(allowed, "tools", "tool_choice.allowed_tools.tools", required=True)):
        where = f"tool_choice.allowed_tools.tools[{j}]"
        function = f.require_object(f.require_object(item, where).get("function"), f"{where}.function")
        names.append(f.get_str(function, "name", f"{where}.function.name", required=True))
    unknown = sorted(set(names) - {t.name for t in tools})
    if unknown:
        raise invalid(f"tool_choice.allowed_tools names {', '.join(map(repr, unknown))}, not in tools.", param="tool_choice.allowed_tools.tools")
    return ToolChoice(mode, allowed=tuple(names))


def thinking_of(body: dict, default: bool) -> bool:
    """`chat_template_kwargs.enable_thinking` (vLLM / mlx-lm), else `reasoning_effort` ('none' is off), else the default."""
    kwargs = f.get_object(body, "chat_template_kwargs", "chat_template_kwargs")
    explicit = f.get_bool(kwargs, "enable_thinking", "chat_template_kwargs.enable_thinking")
    if explicit is not None:
        return explicit
    effort = f.get_str(body, "reasoning_effort", "reasoning_effort")
    if effort is not None:
        return effort != "none"
    return default


def _refuse_unsupported(body: dict) -> None:
    """Options whose silent omission would hand the client something else than it asked for."""
    if f.get_int(body, "n", "n", minimum=1, default=1) != 1:
        raise invalid("n > 1 is not supported: this server writes one reply per request.", param="n")
    if f.get_bool(body, "logprobs", "logprobs", default=False):
        raise invalid("logprobs is not supported: this server returns no token log probabilities (send logprobs: false).", param="logprobs")
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise invalid(f"{legacy} (the deprecated form) is not supported: send tools and tool_choice.", param=legacy)
    response_format = f.get_object(body, "response_format", "response_format")
    if response_format.get("type", "text") != "text":
        raise invalid(f"response_format {response_format.get('type')!r} is not supported (only 'text'): ask for JSON in the prompt.", param="response_format")


def parse_chat_request(body: dict, default_thinking: bool, client: str = "") -> ChatCompletionCall:
    f.note_ignored(body, USED_FIELDS, "openai")
    raw_messages = f.get_list(body, "messages", "messages", required=True)
    if not raw_messages:
        raise invalid("messages must hold at least one message.", param="messages")
    messages = tuple(parse_message(i, m) for i, m in enumerate(raw_messages))
    thinking = thinking_of(body, default_thinking)
    max_tokens = f.get_int(body, "max_completion_tokens", "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = f.get_int(body, "max_tokens", "max_tokens", minimum=1)
    top_k = f.get_int(body, "top_k", "top_k", minimum=-1)
    sampling = f.sampling_for(
        thinking, max_tokens,
        temperature=f.get_float(body, "temperature", "temperature", 0, 2),
        top_p=f.get_float(body, "top_p", "top_p", 0, 1),
        top_k=0 if top_k == -1 else top_k,  # vLLM's -1 means "off"
        min_p=f.get_float(body, "min_p", "min_p", 0, 1),
        presence_penalty=f.get_float(body, "presence_penalty", "presence_penalty", -2, 2),
        frequency_penalty=f.get_float(body, "frequency_penalty", "frequency_penalty", -2, 2),
        repetition_penalty=f.get_float(body, "repetition_penalty", "repetition_penalty", 0.01, 10),  # vLLM's extra
        seed=f.get_seed(body),
        logit_bias=f.logit_bias(body.get("logit_bias")),
    )
    _refuse_unsupported(body)
    tools = parse_tools(body.get("tools"))
    tool_choice = parse_tool_choice(body.get("tool_choice"), tools)
    if f.get_bool(body, "parallel_tool_calls", "parallel_tool_calls", default=True) is False:
        tool_choice = replace(tool_choice, parallel=False)
    stream_options = f.get_object(body, "stream_options", "stream_options")
    request = CompletionRequest(
        messages=messages, sampling=sampling, thinking=thinking, tools=tools, tool_choice=tool_choice,
        stop=f.stop_sequences(body.get("stop"), "stop"), client=client,
    )
    return ChatCompletionCall(
        request,
        stream=bool(f.get_bool(body, "stream", "stream", default=False)),
        include_usage=bool(f.get_bool(stream_options, "include_usage", "stream_options.include_usage", default=False)),
    )


# ------------------------------------------------------------------------------------------------ reply


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def tool_call_body(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}


def completion_body(done: Completed, completion_id: str, created: int, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": done.text if done.text or not done.tool_calls else None}
    if done.reasoning:
        message["reasoning_content"] = done.reasoning
    if done.tool_calls:
        message["tool_calls"] = [tool_call_body(c) for c in done.tool_calls]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": done.model or model,
        "choices": [{"index": 0, "message": message, "finish_reason": FINISH_REASONS[done.finish_reason], "logprobs": None}],
        "usage": usage_body(done.usage),
    }


@dataclass
class ChunkWriter:
    """Turns a job's events into `chat.completion.chunk` objects, one event at a time."""

    model: str
    include_usage: bool = False
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    _started: bool = False

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        chunk = {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }
        if self.include_usage:  # as OpenAI does: null on every chunk but the last
            chunk["usage"] = None
        return chunk

    def chunks(self, event: Any) -> list[dict[str, Any]]:
        out = []
        if not self._started and isinstance(event, (ReasoningDelta, AnswerDelta, ToolCallStarted, Completed)):
            self._started = True
            out.append(self._chunk({"role": "assistant", "content": ""}))
        match event:
            case ReasoningDelta(text=text) if text:
                out.append(self._chunk({"reasoning_content": text}))
            case AnswerDelta(text=text) if text:
                out.append(self._chunk({"content": text}))
            case ToolCallStarted(index=i, id=call_id, name=name):
                out.append(self._chunk({"tool_calls": [{"index": i, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]}))
            case ToolCallFinished(index=i, call=call):
                arguments = json.dumps(call.arguments, ensure_ascii=False)
                out.append(self._chunk({"tool_calls": [{"index": i, "function": {"arguments": arguments}}]}))
            case Completed():
                if event.model:
                    self.model = event.model
                out.append(self._chunk({}, FINISH_REASONS[event.finish_reason]))
                if self.include_usage:
                    out.append({**self._chunk({}), "choices": [], "usage": usage_body(event.usage)})
        return out
