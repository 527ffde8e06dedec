"""OpenAI Responses, the reply side: a job's events -> the `response` object, or its stream events.

Output items come in the order the model writes them: `reasoning` (its text as the item's summary), `message`
(one `output_text` part), then one `function_call` per call (`call_id`, `name`, `arguments` a JSON string). The
stream is the real sequence — `response.created`, `response.in_progress`, per item `response.output_item.added`,
its parts and deltas (`response.reasoning_summary_part.added` / `response.reasoning_summary_text.delta`,
`response.content_part.added` / `response.output_text.delta`, `response.function_call_arguments.delta` / `.done`)
and `response.output_item.done`, then `response.completed` (or `response.incomplete`, `response.failed`) — each with
its `sequence_number`, in the shape the SDK's `responses.stream()` accumulates and Codex reads.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from macapp.core.events import AnswerDelta, Event, Failed, ReasoningDelta
from macapp.core.serving.requests import (
    ChatMessage,
    Completed,
    FinishReason,
    Role,
    ToolCall,
    ToolCallFinished,
    ToolCallStarted,
    Usage,
)
from macapp.server.errors import ApiError
from macapp.server.responses_api import new_id

_STATUS = {
    FinishReason.STOP: "completed",
    FinishReason.STOP_SEQUENCE: "completed",
    FinishReason.TOOL_CALLS: "completed",
    FinishReason.LENGTH: "incomplete",
    FinishReason.CANCELLED: "cancelled",
}
STOPPED_MESSAGE = "The request was stopped before its reply was done (the server is stopping, or the client left)."
_TERMINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed", "cancelled": "response.failed"}


def usage_body(usage: Usage) -> dict[str, object]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},  # the engine's own count
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, object]:
    summary = [{"type": "summary_text", "text": text}] if text else []
    return {"type": "reasoning", "id": item_id, "summary": summary, "status": status}


def text_part(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, object]:
    content = [text_part(text)] if text is not None else []
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, object]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments, "status": status}


def arguments_json(call: ToolCall) -> str:
    return json.dumps(call.arguments, ensure_ascii=False)


def output_items(done: Completed) -> list[dict[str, object]]:
    """The items of a finished reply: reasoning, the message (also when the reply is empty), the calls."""
    status = "incomplete" if done.finish_reason is FinishReason.LENGTH else "completed"
    items = []
    if done.reasoning:
        items.append(reasoning_item(new_id("rs"), done.reasoning, status))
    if done.text or not (done.reasoning or done.tool_calls):
        items.append(message_item(new_id("msg"), done.text, status))
    items.extend(call_item(new_id("fc"), c.id, c.name, arguments_json(c)) for c in done.tool_calls)
    return items


def error_of(error: ApiError) -> dict[str, object]:
    """A failed response's `error`: Codex reads `code` (context_length_exceeded, …) and `message`."""
    return {"code": error.code or "server_error", "message": error.message}


@dataclass
class ResponseShell:
    """What every form of one response shares: its id, time, model and the request's echoed settings."""

    model: str
    echo: dict[str, object]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(
        self, status: str, output: list[dict[str, object]], usage: dict[str, object] | None = None, error: dict[str, object] | None = None
    ) -> dict[str, object]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            "usage": usage,
            **self.echo,
        }


def response_body(shell: ResponseShell, done: Completed) -> dict[str, object]:
    if done.model:
        shell.model = done.model
    return shell.body(_STATUS[done.finish_reason], output_items(done), usage_body(done.usage))


def reply_message(done: Completed) -> ChatMessage:
    """The reply as the next turn of the conversation reads it (previous_response_id)."""
    return ChatMessage(Role.ASSISTANT, done.text, reasoning=done.reasoning or None, tool_calls=done.tool_calls)


@dataclass
class _Open:
    kind: str  # "reasoning" | "message" | "function_call"
    index: int
    id: str
    text: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""


@dataclass
class StreamWriter:
    """Turns a job's events into Responses stream events, keeping the item being written open until the next one
    starts (or the reply ends); the final response holds exactly the items streamed."""

    shell: ResponseShell
    _sequence: int = 0
    _open: _Open | None = None
    _items: list[dict[str, object]] = field(default_factory=list)
    _started: bool = False
    final: dict[str, object] | None = None  # the finished response object, once written

    def _event(self, kind: str, **data: object) -> dict[str, object]:
        event = {"type": kind, **data, "sequence_number": self._sequence}
        self._sequence += 1
        return event

    def start(self) -> list[dict[str, object]]:
        """response.created and response.in_progress; once only."""
        if self._started:
            return []
        self._started = True
        body = self.shell.body("in_progress", [])
        return [self._event("response.created", response=body), self._event("response.in_progress", response=body)]

    def events(self, event: Event) -> list[dict[str, object]]:
        out = self.start()
        match event:
            case ReasoningDelta(text=text) if text:
                if self._open is None or self._open.kind != "reasoning":
                    item_id = new_id("rs")
                    out += self._begin("reasoning", item_id, reasoning_item(item_id, "", "in_progress"))
                    out.append(self._part_event("response.reasoning_summary_part.added", {"type": "summary_text", "text": ""}))
                out.append(self._delta("response.reasoning_summary_text.delta", text))
            case AnswerDelta(text=text) if text:
                if self._open is None or self._open.kind != "message":
                    item_id = new_id("msg")
                    out += self._begin("message", item_id, message_item(item_id, None, "in_progress"))
                    out.append(self._part_event("response.content_part.added", text_part("")))
                out.append(self._delta("response.output_text.delta", text))
            case ToolCallStarted(id=call_id, name=name):
                item_id = new_id("fc")
                out += self._begin("function_call", item_id, call_item(item_id, call_id, name, "", "in_progress"))
                assert self._open is not None
                self._open.call_id, self._open.name = call_id, name
            case ToolCallFinished(call=call):
                if self._open is not None and self._open.kind == "function_call":
                    self._open.text.append(arguments_json(call))
                    out.append(self._delta("response.function_call_arguments.delta", arguments_json(call)))
                out += self._close()
            case Completed():
                out += self._completed(event)
            case Failed():
                pass  # failed() is called with the HTTP error it maps to
        return out

    def failed(self, error: ApiError) -> list[dict[str, object]]:
        out = self.start() + self._close("incomplete")
        self.final = self.shell.body("failed", self._items, error=error_of(error))
        return out + [self._event("response.failed", response=self.final)]

    def _completed(self, done: Completed) -> list[dict[str, object]]:
        status = _STATUS[done.finish_reason]
        out = self._close("incomplete" if status == "incomplete" else "completed")
        if not self._items:  # an empty reply: one empty message, as the JSON form has
            item_id = new_id("msg")
            out += self._begin("message", item_id, message_item(item_id, None, "in_progress"))
            out.append(self._part_event("response.content_part.added", text_part("")))
            out += self._close()
        if done.model:
            self.shell.model = done.model
        error: dict[str, object] | None = {"code": "server_error", "message": STOPPED_MESSAGE} if status == "cancelled" else None
        self.final = self.shell.body(status, self._items, usage_body(done.usage), error)
        return out + [self._event(_TERMINAL_EVENTS[status], response=self.final)]

    def _begin(self, kind: str, item_id: str, item: dict[str, object]) -> list[dict[str, object]]:
        out = self._close()
        self._open = _Open(kind, len(self._items), item_id)
        return out + [self._event("response.output_item.added", output_index=self._open.index, item=item)]

    def _where(self) -> dict[str, object]:
        assert self._open is not None
        return {"item_id": self._open.id, "output_index": self._open.index}

    def _part_event(self, kind: str, part: dict[str, object]) -> dict[str, object]:
        assert self._open is not None
        index = {"summary_index": 0} if self._open.kind == "reasoning" else {"content_index": 0}
        return self._event(kind, **self._where(), **index, part=part)

    def _delta(self, kind: str, text: str) -> dict[str, object]:
        assert self._open is not None
        if self._open.kind != "function_call":
            self._open.text.append(text)
        extra: dict[str, object] = {"summary_index": 0} if self._open.kind == "reasoning" else {}
        if self._open.kind == "message":
            extra = {"content_index": 0, "logprobs": []}
        return self._event(kind, **self._where(), **extra, delta=text)

    def _close(self, status: str = "completed") -> list[dict[str, object]]:
        """Finish the open item: its done events and response.output_item.done."""
        open_, self._open = self._open, None
        if open_ is None:
            return []
        text = "".join(open_.text)
        where = {"item_id": open_.id, "output_index": open_.index}
        if open_.kind == "reasoning":
            item = reasoning_item(open_.id, text, status)
            out = [
                self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=text),
                self._event("response.reasoning_summary_part.done", **where, summary_index=0, part={"type": "summary_text", "text": text}),
            ]
        elif open_.kind == "message":
            item = message_item(open_.id, text, status)
            out = [
                self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]),
                self._event("response.content_part.done", **where, content_index=0, part=text_part(text)),
            ]
        else:
            item = call_item(open_.id, open_.call_id, open_.name, text, status)
            out = [self._event("response.function_call_arguments.done", **where, name=open_.name, arguments=text)]
        self._items.append(item)
        return out + [self._event("response.output_item.done", output_index=open_.index, item=item)]
