"""The content blocks of Anthropic messages, as Claude Code sends them: text, thinking (sent back with its
signature), tool_use, tool_result (text, pictures, plain-text documents, `tool_reference`), image (base64 only),
plain-text documents; `redacted_thinking` is opaque to any model but Claude and is skipped. Which blocks a role
may hold is in its union (UserBlock, AssistantBlock, SystemBlock)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, PrivateAttr, model_validator

from macapp.core.picture_data import ImagePart
from macapp.server.requests.common import Arguments, Model, Refusal, base64_image, kinds, string_or_parts, tag

# Deferred tools (`defer_loading`) are offered like the others (the prompt stays the same between requests, and
# its checkpoints with it), so a `tool_reference` only tells the model the tool it searched for is there.
TOOL_REFERENCE = "Tool available: "


class TextBlock(Model):
    text: str


class ThinkingBlock(Model):
    thinking: str | None = None  # its signature is ignored: nothing here verifies one


class RedactedThinkingBlock(Model):
    pass


class ToolUseBlock(Model):
    id: str
    name: str
    input: Arguments = {}


class ToolReferenceBlock(Model):
    """Claude Code's ToolSearch found a (deferred) tool."""

    tool_name: str


class Base64Source(Model):
    data: str
    media_type: str | None = None


ImageSource = Annotated[Annotated[Base64Source, tag("base64")], kinds("{param} must be 'base64' (the server does not fetch images).")]


class ImageBlock(Model):
    source: ImageSource
    _image: ImagePart = PrivateAttr()

    @model_validator(mode="after")
    def _decode(self) -> ImageBlock:
        self._image = base64_image(self.source.data, self.source.media_type or "")
        return self

    @property
    def image(self) -> ImagePart:
        return self._image


class TextSource(Model):
    data: str


class ContentSource(Model):
    content: ResultContent

    def text(self) -> str:
        text, images = result_content(self.content)
        if images:
            raise Refusal("{param}: pictures inside a document are not supported; send them as image blocks.")
        return text


def _no_pictures(source: ContentSource) -> ContentSource:
    source.text()
    return source


DocumentSource = Annotated[
    Annotated[TextSource, tag("text")] | Annotated[ContentSource, AfterValidator(_no_pictures), tag("content")],
    kinds(
        "{at}: {kind} documents (PDF, files, URLs) are not supported: this server reads plain-text documents only "
        "(source type 'text' or 'content'); send the text instead."
    ),
]


class DocumentBlock(Model):
    """A plain-text document (source `text`, or `content` blocks of text), titled as the client named it."""

    source: DocumentSource
    title: str | None = None
    context: str | None = None

    def text(self) -> str:
        body = self.source.data if isinstance(self.source, TextSource) else self.source.text()
        return "\n".join(part for part in (self.title, self.context, body) if part)


ResultBlock = Annotated[
    Annotated[TextBlock, tag("text")]
    | Annotated[DocumentBlock, tag("document")]
    | Annotated[ToolReferenceBlock, tag("tool_reference")]
    | Annotated[ImageBlock, tag("image")],
    kinds("{param} {kind} is not supported in a tool_result."),
]


# A string, null or blocks.
ResultContent = Annotated[list[ResultBlock], string_or_parts("text", "{param} must be a string or an array of blocks.")]


def result_content(blocks: list[ResultBlock]) -> tuple[str, tuple[ImagePart, ...]]:
    """A tool_result's text and pictures (Claude Code's Read of a picture file, a screenshot tool): the pictures go
    to the model inside the tool's response, as Qwen3.5's template renders them, on builds that see."""
    texts: list[str] = []
    images: list[ImagePart] = []
    for block in blocks:
        match block:
            case TextBlock(text=text):
                texts.append(text)
            case DocumentBlock():
                texts.append(block.text())
            case ToolReferenceBlock(tool_name=name):
                texts.append(TOOL_REFERENCE + name)
            case ImageBlock(image=image):
                images.append(image)
    return "\n".join(texts), tuple(images)


class ToolResultBlock(Model):
    tool_use_id: str
    content: ResultContent = []
    is_error: bool | None = None


UserBlock = Annotated[
    Annotated[TextBlock, tag("text")]
    | Annotated[DocumentBlock, tag("document")]
    | Annotated[ImageBlock, tag("image")]
    | Annotated[ToolResultBlock, tag("tool_result")]
    | Annotated[RedactedThinkingBlock, tag("redacted_thinking")],
    kinds("{param} {kind} is not supported in a user message."),
]
AssistantBlock = Annotated[
    Annotated[TextBlock, tag("text")]
    | Annotated[ThinkingBlock, tag("thinking")]
    | Annotated[ToolUseBlock, tag("tool_use")]
    | Annotated[RedactedThinkingBlock, tag("redacted_thinking")],
    kinds("{param} {kind} is not supported in an assistant message."),
]
SystemBlock = Annotated[Annotated[TextBlock, tag("text")], kinds("{param} must be 'text'.")]


def as_blocks(value: object) -> object:
    """A message's content: a string is one text block."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise Refusal("{param} must be a string or an array of content blocks.")
    return value


ContentSource.model_rebuild()
DocumentBlock.model_rebuild()
ToolResultBlock.model_rebuild()
