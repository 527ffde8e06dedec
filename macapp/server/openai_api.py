"""OpenAI chat completions: a request body -> CompletionRequest (its model: requests/openai_chat.py), and the job's
events -> a completion or its chunks.

Reasoning goes out in `reasoning_content` (message and delta), never in `content`; tool calls as `tool_calls`
entries (`id`, `type: function`, `function.name`, `function.arguments` as a JSON string) with `finish_reason:
"tool_calls"`; usage with `prompt_tokens_details.cached_tokens` (prompt tokens restored from a checkpoint).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from macapp.core.events import AnswerDelta, Event, ReasoningDelta
from macapp.core.jsonvalue import JSONObject
from macapp.core.serving.requests import (
    Completed,
    FinishReason,
    ToolCall,
    ToolCallFinished,
    ToolCallStarted,
    Usage,
)
from macapp.server.requests.openai_chat import ChatCompletionBody, ChatCompletionCall
from macapp.server.requests.reading import read

FINISH_REASONS = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.TOOL_CALLS: "tool_calls",
    FinishReason.CANCELLED: "stop",
}


def parse_chat_request(body: JSONObject, default_thinking: bool, client: str = "") -> ChatCompletionCall:
    """A chat completions body (a JSON object) as the request it asks for, or a 400 naming the field at fault."""
    return read(ChatCompletionBody, body, "openai").to_call(default_thinking, client)


# ------------------------------------------------------------------------------------------------ reply


def usage_body(usage: Usage) -> dict[str, object]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def tool_call_body(call: ToolCall) -> dict[str, object]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}


def completion_body(done: Completed, completion_id: str, created: int, model: str) -> dict[str, object]:
    message: dict[str, object] = {"role": "assistant", "content": done.text if done.text or not done.tool_calls else None}
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

    def _chunk(self, delta: dict[str, object], finish_reason: str | None = None) -> dict[str, object]:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }
        if self.include_usage:  # as OpenAI does: null on every chunk but the last
            chunk["usage"] = None
        return chunk

    def chunks(self, event: Event) -> list[dict[str, object]]:
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
