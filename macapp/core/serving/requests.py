"""One completion request and what it produces, independent of any wire format.

The HTTP front ends (macapp.server: OpenAI chat completions, Anthropic messages) translate their JSON into a
`CompletionRequest`; the runner (macapp.core.serving.runner) executes it on the engine's worker and reports
through a Job the engine's own text events plus the ones below, ending in `Completed` or the engine's `Failed`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping

from macapp.core.events import Event, TerminalEvent
from macapp.core.jsonvalue import JSONObject
from macapp.core.picture_data import ImagePart  # a request's pictures are plain data (named here for the front ends)
from macapp.core.sampling import SamplingParams

# Failed.code for a request the runner cannot serve as sent (an unknown tool in tool_choice, images for a
# text-only server, a history the chat template refuses): the client's mistake, an HTTP 400. The other codes
# are the engine's (macapp.core.events): CONTEXT_LIMIT and MEMORY_BUDGET before any work, NO_MODEL, ERROR.
INVALID_REQUEST = "invalid_request"


class Role(enum.Enum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call; `parameters` is its JSON schema (an object schema)."""

    name: str
    description: str = ""
    parameters: JSONObject = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: Mapping[str, object]  # a mapping, as the Qwen3.5 chat template iterates it; values as the schema types them


class ToolChoiceMode(enum.Enum):
    AUTO = "auto"
    NONE = "none"  # the tools are not offered
    REQUIRED = "required"  # the reply must be a call
    FUNCTION = "function"  # the reply must call `ToolChoice.name`


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    name: str | None = None
    parallel: bool = True  # False: at most one call (the reply ends after it; OpenAI parallel_tool_calls, Anthropic disable_parallel_tool_use)
    allowed: tuple[str, ...] | None = None  # only these tools are offered (OpenAI allowed_tools); None: all


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str = ""
    reasoning: str | None = None  # an assistant turn's earlier reasoning, if the client sent it back
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None  # a tool result: the tool's name, when known
    images: tuple[ImagePart, ...] = ()  # a user turn's (or a tool result's) pictures, in order


@dataclass(frozen=True)
class CompletionRequest:
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams  # max_tokens already clamped by the front end's own rules, seed included
    thinking: bool = False
    thinking_budget: int | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    stop: tuple[str, ...] = ()  # stop sequences (not included in the output)
    continue_reply: bool = False  # a last assistant turn is the reply's start to go on from (Anthropic's prefill)
    client: str = ""  # who asked (for the window's request list): "127.0.0.1:53211 openai"


class FinishReason(enum.Enum):
    STOP = "stop"  # the model ended its turn
    LENGTH = "length"  # max_tokens, or the context limit
    STOP_SEQUENCE = "stop_sequence"  # one of CompletionRequest.stop matched (Completed.stop_sequence says which)
    TOOL_CALLS = "tool_calls"  # the reply ended with one or more tool calls
    CANCELLED = "cancelled"  # Job.stop (a client that went away, or the server shutting down)


@dataclass
class Usage:
    prompt_tokens: int = 0  # the whole prompt
    cached_tokens: int = 0  # of prompt_tokens, restored from a checkpoint instead of read
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens, sampled inside the reasoning (the engine's own count)

    @property
    def read_tokens(self) -> int:
        """Prompt tokens read afresh (Anthropic's input_tokens)."""
        return self.prompt_tokens - self.cached_tokens


@dataclass
class RequestStarted(Event):
    """The engine took the request: its prompt's length and how much of it a checkpoint restores, known before any
    of it is read (the job's first event unless it fails first), so a stream can report usage from its start."""

    prompt_tokens: int
    cached_tokens: int
    cached_from: str = ""  # where the checkpoint came from: "memory" or "disk" (serving.pool), "" with none


@dataclass
class ToolCallStarted(Event):
    """A tool call began streaming (its name is known); `index` counts calls in this reply from 0."""

    index: int
    id: str
    name: str


@dataclass
class ToolCallFinished(Event):
    """A complete, parsed call: front ends send its arguments (OpenAI: a JSON string; Anthropic: input_json)."""

    index: int
    call: ToolCall


@dataclass
class Completed(TerminalEvent):
    text: str  # the answer (no reasoning, no tool-call markup)
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: FinishReason
    usage: Usage
    stop_sequence: str | None = None
    model: str = ""  # the model that answered (the loaded one's name)
    ttft_s: float = 0.0
    generation_tps: float = 0.0
    mtp_acceptance: float | None = None  # drafts the MTP head got right, when it drafted for this reply
    mtp_tokens_per_step: float | None = None  # tokens each verify pass gave (1 + the accepted drafts)
