"""Anthropic Messages: a request body -> CompletionRequest (its model: requests/anthropic_messages.py), and the job's
events -> a message or its SSE events.

The stream is the real sequence: `message_start`, `ping`, then per block `content_block_start` /
`content_block_delta` (`thinking_delta` then `signature_delta`, `text_delta`, `input_json_delta`) /
`content_block_stop`, then `message_delta` (stop_reason, usage) and `message_stop`. Usage: `input_tokens` counts
the prompt tokens read afresh, `cache_read_input_tokens` the ones restored from a checkpoint.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from macapp.core.events import AnswerDelta, Event, ReasoningDelta
from macapp.core.jsonvalue import JSONObject
from macapp.core.serving.requests import (
    Completed,
    FinishReason,
    RequestStarted,
    ToolCallFinished,
    ToolCallStarted,
    Usage,
)
from macapp.server.requests.anthropic_messages import CountTokensBody, MessagesBody, MessagesCall
from macapp.server.requests.reading import read

STOP_REASONS = {
    FinishReason.STOP: "end_turn",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
    FinishReason.TOOL_CALLS: "tool_use",
    FinishReason.CANCELLED: "end_turn",
}
# Claude Code drops a thinking block (and with it the whole reply) that comes without a signature; nothing here
# verifies one, so every block carries this opaque constant (a signature sent back is ignored).
THINKING_SIGNATURE = "qwen-desk-local-thinking"


def parse_messages_request(body: JSONObject, client: str = "", for_counting: bool = False) -> MessagesCall:
    """A messages body (a JSON object) as the request it asks for, or a 400 naming the field at fault;
    `for_counting` (count_tokens): max_tokens may be left out."""
    return read(CountTokensBody if for_counting else MessagesBody, body, "anthropic").to_call(client)


# ------------------------------------------------------------------------------------------------ reply


def usage_body(usage: Usage) -> dict[str, object]:
    return {
        "input_tokens": usage.read_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def message_body(done: Completed, message_id: str, model: str, show_thinking: bool = True) -> dict[str, object]:
    content: list[dict[str, object]] = []
    if done.reasoning:
        content.append({"type": "thinking", "thinking": done.reasoning if show_thinking else "", "signature": THINKING_SIGNATURE})
    if done.text:
        content.append({"type": "text", "text": done.text})
    content.extend({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in done.tool_calls)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": done.model or model,
        "content": content,
        "stop_reason": STOP_REASONS[done.finish_reason],
        "stop_sequence": done.stop_sequence,
        "usage": usage_body(done.usage),
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

    def start(self, usage: Usage | None = None) -> list[tuple[str, dict[str, object]]]:
        """message_start (with the prompt's read/reused split once the engine has it) and a ping; once only."""
        if self._started:
            return []
        self._started = True
        message: dict[str, object] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_body(usage or Usage(prompt_tokens=self.prompt_tokens)),
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def _close(self) -> list[tuple[str, dict[str, object]]]:
        if self._open is None:
            return []
        out = [self._delta({"type": "signature_delta", "signature": THINKING_SIGNATURE})] if self._open == "thinking" else []
        self._open = None
        return [*out, ("content_block_stop", {"type": "content_block_stop", "index": self._index})]

    def _begin(self, kind: str, block: dict[str, object]) -> list[tuple[str, dict[str, object]]]:
        out = self._close()
        self._index += 1
        self._open = kind
        return [*out, ("content_block_start", {"type": "content_block_start", "index": self._index, "content_block": block})]

    def _delta(self, delta: dict[str, object]) -> tuple[str, dict[str, object]]:
        return "content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}

    def events(self, event: Event) -> list[tuple[str, dict[str, object]]]:
        """The stream events for one job event. message_start waits for RequestStarted, the job's first event once
        the engine takes the request, so its usage already says how much of the prompt is read and how much reused
        (Claude Code reads it there); until then the route sends SSE comments as keep-alives."""
        if isinstance(event, RequestStarted):
            return self.start(Usage(prompt_tokens=event.prompt_tokens, cached_tokens=event.cached_tokens))
        out = self._block_events(event)
        return self.start() + out if out else out

    def _block_events(self, event: Event) -> list[tuple[str, dict[str, object]]]:
        out: list[tuple[str, dict[str, object]]] = []
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
