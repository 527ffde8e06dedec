"""The body of Anthropic's `POST /v1/messages` (and `/v1/messages/count_tokens`, where max_tokens may be left out),
and the CompletionRequest it asks for.

Read as Claude Code sends it: system messages inside `messages`, a last assistant turn as a prefill, tool results
first in a user turn; thinking on for `{"type": "enabled", "budget_tokens": N}` (N: the engine's thinking budget)
and "adaptive", off for "disabled" and "between_tools" (this model writes no progress notes between calls);
`output_config.effort` is only a hint, `output_config.format` (structured outputs) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, TypeVar

from pydantic import AfterValidator, BeforeValidator, JsonValue, model_validator

from macapp.core.serving.requests import (
    ChatMessage,
    CompletionRequest,
    Role,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
)
from macapp.server.errors import invalid
from macapp.server.requests.anthropic_blocks import (
    AssistantBlock,
    DocumentBlock,
    ImageBlock,
    RedactedThinkingBlock,
    SystemBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UserBlock,
    as_blocks,
    result_content,
)
from macapp.server.requests.common import (
    WHOLE,
    Count,
    Fraction,
    JSONObjectField,
    Model,
    Refusal,
    StopSequences,
    bounds,
    kinds,
    sampling_for,
    string_or_parts,
    tag,
)

ERROR_RESULT_PREFIX = "Error: "  # a tool_result with is_error, as the model reads it (the template has no flag)
# thinking.display: "omitted" sends thinking blocks without their text; "summarized", Claude Code's "updates"
# (the thinking-display-updates beta) and any later display send it as it streams.
HIDDEN_THINKING = "omitted"
_TOOL_CHOICES = {"auto": ToolChoiceMode.AUTO, "any": ToolChoiceMode.REQUIRED, "tool": ToolChoiceMode.FUNCTION, "none": ToolChoiceMode.NONE}


@dataclass(frozen=True)
class MessagesCall:
    request: CompletionRequest
    stream: bool = False
    show_thinking: bool = True  # thinking.display "omitted": the blocks come back empty


# ------------------------------------------------------------------------------------------------ messages


class UserMessage(Model):
    content: Annotated[list[UserBlock], BeforeValidator(as_blocks)]

    def to_messages(self, call_names: dict[str, str]) -> list[ChatMessage]:
        """Its tool results first (one tool message each, in order), then its text and images."""
        results, texts, images = [], [], []
        for block in self.content:
            match block:
                case TextBlock(text=text):
                    texts.append(text)
                case DocumentBlock():
                    texts.append(block.text() + "\n\n")
                case ImageBlock(image=image):
                    images.append(image)
                case ToolResultBlock(tool_use_id=call_id):
                    text, pictures = result_content(block.content)
                    if block.is_error:
                        text = ERROR_RESULT_PREFIX + text
                    results.append(ChatMessage(Role.TOOL, text, tool_call_id=call_id, name=call_names.get(call_id), images=pictures))
                case RedactedThinkingBlock():
                    pass
        if texts or images or not results:
            results.append(ChatMessage(Role.USER, "".join(texts), images=tuple(images)))
        return results


class AssistantMessage(Model):
    content: Annotated[list[AssistantBlock], BeforeValidator(as_blocks)]

    def to_message(self, call_names: dict[str, str]) -> ChatMessage:
        texts, reasoning, calls = [], [], []
        for block in self.content:
            match block:
                case TextBlock(text=text):
                    texts.append(text)
                case ThinkingBlock(thinking=thinking):
                    reasoning.append(thinking or "")
                case ToolUseBlock(id=call_id, name=name, input=arguments):
                    call_names[call_id] = name
                    calls.append(ToolCall(call_id, name, arguments))
        return ChatMessage(Role.ASSISTANT, "".join(texts), reasoning="".join(reasoning) or None, tool_calls=tuple(calls))


BILLING_HEADER = "x-anthropic-billing-header:"


def system_text(blocks: list[TextBlock]) -> str:
    """The system blocks joined, Claude Code's billing line left out: it is metadata for Anthropic's servers, not an
    instruction, and its suffix changes every session, so keeping it would make every session's prompt differ from
    its first token on (no checkpoint of the last session could be reused)."""
    return "\n\n".join(b.text for b in blocks if not b.text.startswith(BILLING_HEADER))


class SystemMessage(Model):
    """Claude Code (2.1.154 on) sends hook context so; rendered in place (render.py)."""

    content: Annotated[list[SystemBlock], BeforeValidator(as_blocks)]


Message = Annotated[
    Annotated[UserMessage, tag("user")] | Annotated[AssistantMessage, tag("assistant")] | Annotated[SystemMessage, tag("system")],
    kinds("{param} {kind} is not 'user', 'assistant' or 'system'.", field="role"),
]


T = TypeVar("T")


def _some_messages(messages: list[T]) -> list[T]:
    if not messages:
        raise Refusal("{param}: at least one message is required.")
    return messages


# ------------------------------------------------------------------------------------------------ tools, thinking


class Tool(Model):
    name: str
    description: str | None = None
    input_schema: JSONObjectField | None = None

    @model_validator(mode="before")
    @classmethod
    def _custom_only(cls, value: object) -> object:
        if isinstance(value, dict) and (value.get("type", "custom") != "custom" or "input_schema" not in value):
            raise Refusal(f"{{param}}: only custom tools with an input_schema are supported (not {value.get('type')!r}).")
        return value

    def to_spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description or "", self.input_schema or {})


class ToolChoiceBody(Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    def to_choice(self, tools: tuple[ToolSpec, ...]) -> ToolChoice:
        mode, parallel = _TOOL_CHOICES[self.type], not self.disable_parallel_tool_use
        if mode is not ToolChoiceMode.FUNCTION:
            return ToolChoice(mode, parallel=parallel)
        if self.name is None:
            raise invalid("tool_choice.name is required.", param="tool_choice.name")
        if self.name not in {t.name for t in tools}:
            raise invalid(f"tool_choice names {self.name!r}, which is not in tools.", param="tool_choice.name")
        return ToolChoice(mode, self.name, parallel)


class _Thinking(Model):
    display: str | None = None
    on: ClassVar[bool] = False

    @property
    def shown(self) -> bool:
        return self.display != HIDDEN_THINKING

    @property
    def budget(self) -> int | None:
        """The engine's thinking budget; None: the engine's own."""
        return None


class ThinkingOff(_Thinking):
    pass


class AdaptiveThinking(_Thinking):
    on: ClassVar[bool] = True


class EnabledThinking(_Thinking):
    on: ClassVar[bool] = True
    budget_tokens: Annotated[int, WHOLE, bounds(0)] | None = None

    @property
    def budget(self) -> int | None:
        return self.budget_tokens


def _thinking_kind(value: object) -> object:
    if not isinstance(value, dict):
        return None
    return "disabled" if not value else value.get("type")  # {}: off


Thinking = Annotated[
    Annotated[EnabledThinking, tag("enabled")]
    | Annotated[AdaptiveThinking, tag("adaptive")]
    | Annotated[ThinkingOff, tag("disabled")]
    | Annotated[ThinkingOff, tag("between_tools")],
    kinds("{param} {kind} is not 'enabled', 'adaptive', 'disabled' or 'between_tools'.", tag_of=_thinking_kind),
]


class OutputConfig(Model):
    format: JsonValue = None  # `effort` is only a hint

    @model_validator(mode="after")
    def _no_format(self) -> OutputConfig:
        if self.format is not None:
            raise Refusal("{param} (structured outputs) is not supported: ask for JSON in the prompt.", ".format")
        return self


# ------------------------------------------------------------------------------------------------ the body


class CountTokensBody(Model):
    """The fields read, in the order they are checked (the first one at fault is the one named)."""

    messages: Annotated[list[Message], AfterValidator(_some_messages)]
    system: Annotated[list[SystemBlock], string_or_parts("text", "{param} must be a string or an array of text blocks.")] = []
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    max_tokens: Count | None = None
    temperature: Fraction | None = None
    top_p: Fraction | None = None
    top_k: Annotated[int, WHOLE, bounds(0)] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoiceBody | None = None
    stop_sequences: StopSequences = ()
    stream: bool | None = None
    model: JsonValue = None  # any name is served by the loaded model

    def chat_messages(self) -> tuple[ChatMessage, ...]:
        system = system_text(self.system)
        out = [ChatMessage(Role.SYSTEM, system)] if system else []
        call_names: dict[str, str] = {}
        for message in self.messages:
            match message:
                case UserMessage():
                    out.extend(message.to_messages(call_names))
                case AssistantMessage():
                    out.append(message.to_message(call_names))
                case SystemMessage(content=blocks):
                    out.append(ChatMessage(Role.SYSTEM, system_text(blocks)))
        if all(m.role is Role.SYSTEM for m in out):
            raise invalid("messages: at least one user or assistant message is required (the system prompt is not one).", param="messages")
        return tuple(out)

    def to_call(self, client: str = "") -> MessagesCall:
        messages = self.chat_messages()
        thinking = self.thinking or ThinkingOff()
        sampling = sampling_for(thinking.on, self.max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        tools = tuple(t.to_spec() for t in self.tools or ())
        request = CompletionRequest(
            messages=messages,
            sampling=sampling,
            thinking=thinking.on,
            thinking_budget=thinking.budget,
            tools=tools,
            tool_choice=self.tool_choice.to_choice(tools) if self.tool_choice else ToolChoice(),
            stop=self.stop_sequences,
            client=client,
            continue_reply=messages[-1].role is Role.ASSISTANT,  # a prefill: the reply goes on from it
        )
        return MessagesCall(request, stream=bool(self.stream), show_thinking=thinking.shown)


class MessagesBody(CountTokensBody):
    max_tokens: Count
