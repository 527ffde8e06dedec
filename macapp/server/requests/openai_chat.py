"""The body of OpenAI's `POST /v1/chat/completions`, and the CompletionRequest it asks for.

Messages by role (`developer` is a system message), content as a string or `text` / `image_url` parts (data:
URLs only), tools of type `function`, `tool_choice` as a mode, a named function or `allowed_tools`, the sampling
fields of OpenAI and vLLM (`top_k`, `min_p`, `repetition_penalty`), thinking from `chat_template_kwargs` or
`reasoning_effort`. Options whose silent omission would hand the client something else than it asked for (`n` > 1,
`logprobs`, the deprecated `functions`, a structured `response_format`) are refused.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Annotated, Literal, TypeVar

from pydantic import AfterValidator, BeforeValidator, JsonValue, PlainValidator, model_validator

from macapp.core.picture_data import ImagePart
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
from macapp.server.requests.common import (
    WHOLE,
    Arguments,
    Count,
    Fraction,
    JSONObjectField,
    LogitBias,
    Model,
    Refusal,
    Seed,
    StopSequences,
    bounds,
    data_url_image,
    data_url_video,
    kinds,
    sampling_for,
    string_or_parts,
    tag,
    within,
)


@dataclass(frozen=True)
class ChatCompletionCall:
    request: CompletionRequest
    stream: bool = False
    include_usage: bool = False


# ------------------------------------------------------------------------------------------------ messages


class TextPart(Model):
    text: str


def _image_url(value: object) -> ImagePart:
    """`{"url": "data:..."}`, or the URL itself."""
    return data_url_image(value.get("url") if isinstance(value, dict) else value, suffix=".url")


class ImageUrlPart(Model):
    image_url: Annotated[ImagePart, PlainValidator(_image_url)]


def _video_url(value: object) -> ImagePart:
    """`{"url": "data:video/..."}`, or the URL itself."""
    return data_url_video(value.get("url") if isinstance(value, dict) else value, suffix=".url")


class VideoUrlPart(Model):
    video_url: Annotated[ImagePart, PlainValidator(_video_url)]


Part = Annotated[
    Annotated[TextPart, tag("text")]
    | Annotated[TextPart, tag("input_text")]
    | Annotated[ImageUrlPart, tag("image_url")]
    | Annotated[VideoUrlPart, tag("video_url")],
    kinds("{param} {kind} is not supported (use 'text', 'image_url' or 'video_url')."),
]


# A string, null, or content parts.
Content = Annotated[list[Part], string_or_parts("text", "{param} must be a string or an array of content parts.")]


def _text(parts: list[Part]) -> str:
    return "".join(p.text for p in parts if isinstance(p, TextPart))


def _images(parts: list[Part]) -> tuple[ImagePart, ...]:
    """The pictures and videos, in order (a video's sampling is the body's: `with_video_sampling`)."""
    return tuple(p.image_url if isinstance(p, ImageUrlPart) else p.video_url for p in parts if isinstance(p, (ImageUrlPart, VideoUrlPart)))


def with_video_sampling(message: ChatMessage, fps: float | None, max_frames: int | None) -> ChatMessage:
    """The message's videos carrying the request's `video_fps` / `video_max_frames`."""
    if not any(image.is_video for image in message.images):
        return message
    images = tuple(replace(image, fps=fps, max_frames=max_frames) if image.is_video else image for image in message.images)
    return replace(message, images=images)


class _Message(Model):
    content: Content = []

    def no_pictures(self, role: str) -> None:
        """The template has no place for them in this role: never dropped silently."""
        if _images(self.content):
            raise Refusal(f"{{at}}: pictures go in user (or tool) messages, not in a {role} message.", ".content")


class SystemMessage(_Message):
    role: str  # system or developer

    @model_validator(mode="after")
    def _text_only(self) -> SystemMessage:
        self.no_pictures(self.role)
        return self

    def to_message(self) -> ChatMessage:
        return ChatMessage(Role.SYSTEM, _text(self.content))


class UserMessage(_Message):
    def to_message(self) -> ChatMessage:
        return ChatMessage(Role.USER, _text(self.content), images=_images(self.content))


class FunctionCall(Model):
    name: str
    arguments: Arguments = {}


class ToolCallItem(Model):
    id: str | None = None
    function: FunctionCall

    def to_call(self) -> ToolCall:
        return ToolCall(self.id or f"call_{uuid.uuid4().hex[:24]}", self.function.name, self.function.arguments)


def _none_if_empty(value: object) -> object:
    """Clients send `tool_calls: {}`, "" or false for none: taken as none, as the API always has."""
    return value if value else None


class AssistantMessage(_Message):
    reasoning_content: str | None = None
    reasoning: str | None = None  # what some clients (opencode's) send back instead
    tool_calls: Annotated[list[ToolCallItem] | None, BeforeValidator(_none_if_empty)] = None

    @model_validator(mode="after")
    def _text_only(self) -> AssistantMessage:
        self.no_pictures("assistant")
        return self

    def to_message(self) -> ChatMessage:
        calls = tuple(c.to_call() for c in self.tool_calls or ())
        return ChatMessage(Role.ASSISTANT, _text(self.content), reasoning=self.reasoning_content or self.reasoning, tool_calls=calls)


class ToolMessage(_Message):
    tool_call_id: str | None = None
    name: str | None = None

    def to_message(self) -> ChatMessage:
        text, images = _text(self.content), _images(self.content)
        return ChatMessage(Role.TOOL, text, tool_call_id=self.tool_call_id, name=self.name, images=images)


Message = Annotated[
    Annotated[SystemMessage, tag("system")]
    | Annotated[SystemMessage, tag("developer")]
    | Annotated[UserMessage, tag("user")]
    | Annotated[AssistantMessage, tag("assistant")]
    | Annotated[ToolMessage, tag("tool")],
    kinds("{param} {kind} is not one of 'system', 'developer', 'user', 'assistant', 'tool'.", field="role"),
]


# ------------------------------------------------------------------------------------------------ tools


class FunctionSpec(Model):
    name: str
    description: str | None = None
    parameters: JSONObjectField | None = None


class Tool(Model):
    type: Literal["function"] = "function"
    function: FunctionSpec

    def to_spec(self) -> ToolSpec:
        return ToolSpec(self.function.name, self.function.description or "", self.function.parameters or {})


def _mode(value: object) -> ToolChoiceMode:
    modes = {"auto": ToolChoiceMode.AUTO, "none": ToolChoiceMode.NONE, "required": ToolChoiceMode.REQUIRED}
    if value == "function":
        raise Refusal('{param} \'function\' needs the function\'s name: {"type": "function", "function": {"name": ...}}.')
    if not isinstance(value, str) or value not in modes:
        raise Refusal(f"{{param}} {value!r} is not 'auto', 'none', 'required' or a named function.")
    return modes[value]


class FunctionName(Model):
    name: str


class NamedFunction(Model):
    function: FunctionName


class AllowedTools(Model):
    mode: Literal["auto", "required"]
    tools: list[NamedFunction]


class AllowedToolsChoice(Model):
    """{"type": "allowed_tools", "allowed_tools": {"mode": ..., "tools": [{"type": "function", "function": {"name":
    ...}}]}}: the model may call only those (`ToolChoice.allowed`; the others are not offered)."""

    allowed_tools: AllowedTools


def _choice_kind(value: object) -> object:
    if isinstance(value, str):
        return "mode"
    return value.get("type", "function") if isinstance(value, dict) else None


ToolChoiceValue = Annotated[
    Annotated[ToolChoiceMode, PlainValidator(_mode), tag("mode")]
    | Annotated[NamedFunction, tag("function")]
    | Annotated[AllowedToolsChoice, tag("allowed_tools")],
    kinds("{at} type {kind} is not supported (only 'function' and 'allowed_tools').", tag_of=_choice_kind),
]


def _tool_choice(value: ToolChoiceValue | None, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    names = {t.name for t in tools}
    match value:
        case None:
            return ToolChoice()
        case ToolChoiceMode():
            return ToolChoice(value)
        case NamedFunction(function=FunctionName(name=name)):
            if name not in names:
                raise invalid(f"tool_choice names {name!r}, which is not in tools.", param="tool_choice.function.name")
            return ToolChoice(ToolChoiceMode.FUNCTION, name)
        case AllowedToolsChoice(allowed_tools=allowed):
            chosen = [t.function.name for t in allowed.tools]
            unknown = sorted(set(chosen) - names)
            if unknown:
                raise invalid(f"tool_choice.allowed_tools names {', '.join(map(repr, unknown))}, not in tools.", param="tool_choice.allowed_tools.tools")
            mode = ToolChoiceMode.AUTO if allowed.mode == "auto" else ToolChoiceMode.REQUIRED
            return ToolChoice(mode, allowed=tuple(chosen))
    raise TypeError(f"not a tool choice: {value!r}")  # unreachable: the union has no other member


# ------------------------------------------------------------------------------------------------ the body


class TemplateKwargs(Model):
    enable_thinking: bool | None = None


class StreamOptions(Model):
    include_usage: bool | None = None


def _one_reply(n: int) -> int:
    if n != 1:
        raise Refusal("n > 1 is not supported: this server writes one reply per request.")
    return n


def _no_logprobs(on: bool) -> bool:
    if on:
        raise Refusal("logprobs is not supported: this server returns no token log probabilities (send logprobs: false).")
    return on


def _not_legacy(value: JsonValue) -> JsonValue:
    if value is not None:
        raise Refusal("{param} (the deprecated form) is not supported: send tools and tool_choice.")
    return value


Legacy = Annotated[JsonValue, AfterValidator(_not_legacy)]


class ResponseFormat(Model):
    type: JsonValue = "text"

    @model_validator(mode="after")
    def _only_text(self) -> ResponseFormat:
        if self.type != "text":
            raise Refusal(f"response_format {self.type!r} is not supported (only 'text'): ask for JSON in the prompt.")
        return self


T = TypeVar("T")


def _some_messages(messages: list[T]) -> list[T]:
    if not messages:
        raise Refusal("messages must hold at least one message.")
    return messages


TopK = Annotated[int, WHOLE, bounds(-1)]  # vLLM's -1 means "off"
Temperature = Annotated[float, within(0, 2)]
Penalty = Annotated[float, within(-2, 2)]
RepetitionPenalty = Annotated[float, within(0.01, 10)]  # vLLM's extra


class ChatCompletionBody(Model):
    """The fields read, in the order they are checked (the first one at fault is the one named)."""

    messages: Annotated[list[Message], AfterValidator(_some_messages)]
    model: JsonValue = None  # any name is served by the loaded model
    chat_template_kwargs: TemplateKwargs | None = None
    reasoning_effort: str | None = None
    max_completion_tokens: Count | None = None
    max_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: Fraction | None = None
    top_k: TopK | None = None
    min_p: Fraction | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    seed: Seed | None = None
    logit_bias: LogitBias = None
    n: Annotated[Count, AfterValidator(_one_reply)] | None = None
    logprobs: Annotated[bool, AfterValidator(_no_logprobs)] | None = None
    functions: Legacy = None
    function_call: Legacy = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoiceValue | None = None
    parallel_tool_calls: bool | None = None
    stream_options: StreamOptions | None = None
    stop: StopSequences = ()
    stream: bool | None = None
    video_fps: Annotated[float, within(0.01, 240)] | None = None  # vllm-mlx's per-request video sampling
    video_max_frames: Annotated[int, WHOLE, bounds(2, 4096)] | None = None

    def thinking(self, default: bool) -> bool:
        """`chat_template_kwargs.enable_thinking` (vLLM / mlx-lm), else `reasoning_effort` ('none' is off), else the default."""
        explicit = self.chat_template_kwargs.enable_thinking if self.chat_template_kwargs else None
        if explicit is not None:
            return explicit
        if self.reasoning_effort is not None:
            return self.reasoning_effort != "none"
        return default

    def to_call(self, default_thinking: bool, client: str = "") -> ChatCompletionCall:
        thinking = self.thinking(default_thinking)
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        sampling = sampling_for(
            thinking,
            max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=0 if self.top_k == -1 else self.top_k,
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
            logit_bias=self.logit_bias,
        )
        tools = tuple(t.to_spec() for t in self.tools or ())
        tool_choice = _tool_choice(self.tool_choice, tools)
        if self.parallel_tool_calls is False:
            tool_choice = replace(tool_choice, parallel=False)
        request = CompletionRequest(
            messages=tuple(with_video_sampling(m.to_message(), self.video_fps, self.video_max_frames) for m in self.messages),
            sampling=sampling,
            thinking=thinking,
            tools=tools,
            tool_choice=tool_choice,
            stop=self.stop,
            client=client,
        )
        include_usage = bool(self.stream_options and self.stream_options.include_usage)
        return ChatCompletionCall(request, stream=bool(self.stream), include_usage=include_usage)
