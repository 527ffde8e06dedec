"""The input items of OpenAI's `POST /v1/responses`, as Codex and `client.responses.create` send them, and the
conversation they make.

`input` is a string or a list of items: messages (`system` / `developer` / `user` / `assistant`; `input_text`,
`output_text`, `refusal`, `input_image` data URLs), `function_call` and `function_call_output` items (and Codex's
`custom_tool_call` / `custom_tool_call_output`), `reasoning` items sent back (read into the next assistant turn's
reasoning). Items the server never produced and cannot replay (web search calls, local shell calls, ...) are left
out of the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, JsonValue, PlainValidator

from macapp.core.picture_data import ImagePart
from macapp.core.serving.requests import ChatMessage, Role, ToolCall
from macapp.server.requests.common import Arguments, Model, Refusal, data_url_image, kinds, refuse, string_or_parts, tag

ROLES = {"system": Role.SYSTEM, "developer": Role.SYSTEM, "user": Role.USER, "assistant": Role.ASSISTANT}
# Output items of tools that run elsewhere (OpenAI's servers, the client's shell): nothing here can replay them.
SKIPPED_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "local_shell_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "compaction",
        "compaction_summary",
        "ghost_snapshot",
        "tool_search_call",
        "tool_search_output",
    }
)
CUSTOM_INPUT = "input"  # a custom tool call's raw input, as the template's argument mapping holds it


# ------------------------------------------------------------------------------------------------ content parts


class TextPart(Model):
    text: str


class RefusalPart(Model):
    refusal: str


# OpenAI's Responses schema has no video input (its parts: text, image, file, audio): said, never dropped.
NO_VIDEO = "{at}: the Responses API has no video input in its schema: send the video to /v1/chat/completions as a video_url part."


def _input_image(value: object) -> ImagePart:
    if value is None:
        raise Refusal("{param}: only image_url data: URLs are supported (no file_id: this server has no Files API).")
    return data_url_image(value.get("url") if isinstance(value, dict) else value)


class InputImagePart(Model):
    image_url: Annotated[ImagePart, PlainValidator(_input_image)] = Field(default=None, validate_default=True)


Part = Annotated[
    Annotated[TextPart, tag("input_text")]
    | Annotated[TextPart, tag("output_text")]
    | Annotated[TextPart, tag("text")]
    | Annotated[RefusalPart, tag("refusal")]
    | Annotated[InputImagePart, tag("input_image")]
    | Annotated[None, refuse("{at}: input_file is not supported: send the file's text as input_text."), tag("input_file")]
    | Annotated[None, refuse(NO_VIDEO), tag("input_video")]
    | Annotated[None, refuse(NO_VIDEO), tag("video_url")],
    kinds("{param} {kind} is not supported (input_text, output_text, input_image)."),
]


# A message's (or a tool output's): a string or parts.
Content = Annotated[list[Part], string_or_parts("input_text", "{param} must be a string or an array of content parts.")]


def text_and_images(parts: list[Part]) -> tuple[str, tuple[ImagePart, ...]]:
    texts: list[str] = []
    images: list[ImagePart] = []
    for part in parts:
        match part:
            case TextPart(text=text) | RefusalPart(refusal=text):
                texts.append(text)
            case InputImagePart(image_url=image):
                images.append(image)
    return "".join(texts), tuple(images)


# ------------------------------------------------------------------------------------------------ items


class MessageItem(Model):
    role: Literal["system", "developer", "user", "assistant"]
    content: Content = []

    def to_message(self) -> ChatMessage:
        text, images = text_and_images(self.content)
        return ChatMessage(ROLES[self.role], text, images=images)


def _pictures_from_users(item: MessageItem) -> MessageItem:
    """The template has no place for them elsewhere: never dropped silently."""
    if item.role != "user" and text_and_images(item.content)[1]:
        raise Refusal(f"{{at}}: pictures go in user messages (or function_call_output), not in a {item.role} message.", ".content")
    return item


class FunctionCallItem(Model):
    call_id: str
    name: str
    arguments: Arguments = {}

    def to_call(self) -> ToolCall:
        return ToolCall(self.call_id, self.name, self.arguments)


class CustomToolCallItem(Model):
    call_id: str
    name: str
    input: str | None = None

    def to_call(self) -> ToolCall:
        return ToolCall(self.call_id, self.name, {CUSTOM_INPUT: self.input or ""})


class OutputItem(Model):
    """A function_call_output (or custom_tool_call_output): the tool's answer, text and pictures."""

    call_id: str
    output: Content = []


class ReasoningPart(Model):
    type: JsonValue = None
    text: str | None = None


class ReasoningItem(Model):
    content: list[ReasoningPart] | None = None
    summary: list[ReasoningPart] | None = None

    def text(self) -> str:
        """Its reasoning_text content when sent, else its summary (what this server writes); "" for
        encrypted_content only (another server's, unreadable here)."""
        for parts, types in ((self.content, ("reasoning_text", "text")), (self.summary, ("summary_text",))):
            texts = [p.text or "" for p in parts or () if p.type in types]
            if texts:
                return "\n".join(texts)
        return ""


class SkippedItem(Model):
    pass


def _item_kind(value: object) -> object:
    kind = value.get("type", "message") if isinstance(value, dict) else None
    return "skipped" if isinstance(kind, str) and kind in SKIPPED_ITEMS else kind


Item = Annotated[
    Annotated[MessageItem, AfterValidator(_pictures_from_users), tag("message")]
    | Annotated[FunctionCallItem, tag("function_call")]
    | Annotated[CustomToolCallItem, tag("custom_tool_call")]
    | Annotated[OutputItem, tag("function_call_output")]
    | Annotated[OutputItem, tag("custom_tool_call_output")]
    | Annotated[ReasoningItem, tag("reasoning")]
    | Annotated[SkippedItem, tag("skipped")]
    | Annotated[None, refuse("{at}: item_reference is not supported: send the items themselves, or previous_response_id."), tag("item_reference")],
    kinds("{param} {kind} is not a supported input item.", tag_of=_item_kind),
]


def _as_items(value: object) -> object:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise Refusal("{param} must be a string or an array of input items.")
    return value


Input = Annotated[list[Item], BeforeValidator(_as_items)]


# ------------------------------------------------------------------------------------------------ the conversation


@dataclass
class Turns:
    """Builds the conversation item by item: function calls join the assistant turn they follow, a reasoning item
    waits for the assistant turn after it (the order a response's output comes in)."""

    messages: list[ChatMessage] = field(default_factory=list)
    call_names: dict[str, str] = field(default_factory=dict)
    reasoning: list[str] = field(default_factory=list)

    def add(self, message: ChatMessage) -> None:
        if message.role is Role.ASSISTANT and self.reasoning:
            message = replace(message, reasoning="\n".join(self.reasoning))
        if message.role is not Role.ASSISTANT or self.reasoning:
            self.reasoning = []
        self.messages.append(message)

    def add_call(self, call: ToolCall) -> None:
        self.call_names[call.id] = call.name
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role is Role.ASSISTANT and not self.reasoning:
            self.messages[-1] = replace(last, tool_calls=(*last.tool_calls, call))
        elif last is not None and last.role is Role.ASSISTANT:  # a reasoning item between the text and the call
            joined = "\n".join(filter(None, [last.reasoning, *self.reasoning]))
            self.messages[-1] = replace(last, reasoning=joined, tool_calls=(*last.tool_calls, call))
            self.reasoning = []
        else:
            self.add(ChatMessage(Role.ASSISTANT, "", tool_calls=(call,)))

    def read(self, item: Item) -> None:
        match item:
            case MessageItem():
                self._add_message(item.to_message())
            case FunctionCallItem() | CustomToolCallItem():
                self.add_call(item.to_call())
            case OutputItem(call_id=call_id):
                text, images = text_and_images(item.output)
                self.add(ChatMessage(Role.TOOL, text, tool_call_id=call_id, name=self.call_names.get(call_id), images=images))
            case ReasoningItem():
                text = item.text()
                if text:
                    self.reasoning.append(text)

    def _add_message(self, message: ChatMessage) -> None:
        last = self.messages[-1] if self.messages else None
        if message.role is Role.ASSISTANT and last is not None and last.role is Role.ASSISTANT and not last.tool_calls and not self.reasoning:
            self.messages[-1] = replace(last, content=last.content + message.content)  # one turn in several items
        else:
            self.add(message)


def conversation(items: list[Item], previous: tuple[ChatMessage, ...] = ()) -> tuple[ChatMessage, ...]:
    """The items after the previous response's conversation (if any)."""
    turns = Turns(messages=list(previous), call_names={c.id: c.name for m in previous for c in m.tool_calls})
    for item in items:
        turns.read(item)
    return tuple(turns.messages)
