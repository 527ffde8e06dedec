"""The history's records: conversations, messages and their reply figures, as the store hands them out."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, Callable, get_args, get_type_hints

from macapp.core.events import format_stats
from macapp.core.jsonvalue import JSONObject
from macapp.core.picture_data import ImageRef, PictureFiles
from macapp.core.tools.rounds import session_rounds

TITLE_LIMIT = 60


class Role(enum.StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


class MessageState(enum.StrEnum):
    STREAMING = "streaming"  # a reply being written (or cut off by a crash, until recover_interrupted)
    STOPPED = "stopped"  # a reply that ended early (stopped, failed, interrupted): what was written is kept
    COMPLETE = "complete"


ROLES = tuple(Role)
STATES = tuple(MessageState)


@dataclass
class ReplyStats:
    """Per-reply figures; None where unknown. Each field is also a column of the messages table."""

    ttft_s: float | None = None
    prompt_tokens: int | None = None
    prompt_tps: float | None = None
    generation_tokens: int | None = None
    generation_tps: float | None = None
    reasoning_tokens: int | None = None
    peak_memory_bytes: int | None = None
    image_tokens: int | None = None  # of prompt_tokens, the pictures' (schema 4)

    @classmethod
    def from_any(cls, obj: object) -> ReplyStats:
        """Build from a ReplyStats, a dict, or any object with these attribute names (e.g. the engine's stats)."""
        if obj is None:
            return cls()
        if isinstance(obj, cls):
            return obj
        get: Callable[[str], object]
        if isinstance(obj, dict):
            get = obj.get
        else:
            get = lambda name: getattr(obj, name, None)  # noqa: E731
        values: dict[str, Any] = {}
        for name, kind in STAT_TYPES.items():
            value = get(name)
            values[name] = None if value is None else kind(value)
        return cls(**values)

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def summary(self) -> str:
        """The same one-line stats as the chat command line (macapp.core.events.format_stats)."""
        return format_stats(self)


# The reply-stat fields, declared once: the schema check, inserts, updates and row mapping all read this.
STAT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ReplyStats))
# Each field's number type (int for counts, float for times and rates), from its annotation.
STAT_TYPES: dict[str, type] = {name: int if int in get_args(hint) else float for name, hint in get_type_hints(ReplyStats).items()}


@dataclass
class Message:
    id: int
    conversation_id: int
    position: int
    role: Role
    content: str
    reasoning: str = ""
    thinking: bool = False
    state: MessageState = MessageState.COMPLETE
    finish_reason: str | None = None
    stats: ReplyStats = field(default_factory=ReplyStats)
    model: str | None = None
    created: float = 0.0
    images: tuple[ImageRef, ...] = ()  # pictures sent with a user message (files in paths.pictures_dir())
    # A reply's tool calls (schema 5), each events.ToolCallRecord.to_json(): server, name, arguments, allowed, result…
    tool_calls: list[JSONObject] = field(default_factory=list)
    # A reply's tokens as the session's cache held them (schema 6; events.Reply.cache_tokens), so a reopened
    # conversation reads exactly what its session held; () when unknown (older rows, tool turns, failed replies).
    cache_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.role, self.state = Role(self.role), MessageState(self.state)  # plain strings are accepted too

    @property
    def stopped(self) -> bool:
        return self.state is MessageState.STOPPED


@dataclass
class Conversation:
    id: int
    title: str
    model: str
    created: float
    updated: float
    system_prompt: str | None = None
    settings: JSONObject = field(default_factory=dict)
    message_count: int = 0
    messages: list[Message] = field(default_factory=list)  # filled by get_conversation, empty in listings
    # The store's, to read pictures back in chat_messages (None: a store opened without them).
    pictures: PictureFiles | None = field(default=None, repr=False, compare=False)

    @property
    def display_title(self) -> str:
        return self.title or "New chat"

    def chat_messages(self, include_system: bool = True) -> list[dict[str, object]]:
        """The conversation in the engine's message shape, to reopen it: `engine.new_session(messages=...)`.

        {role, content}; replies also carry reasoning, thinking, finish_reason and, when saved, cache_tokens, like
        ChatSession.messages; a message with pictures carries them under "images" (read back from the pictures folder
        by the store's PictureFiles; a missing file is left out, the text stays; a store opened without PictureFiles
        gives none). A reply with tool calls comes back as its rounds (tools.rounds.session_rounds), as the session
        held it (their text: no cache_tokens).
        """
        out: list[dict[str, object]] = []
        if include_system and self.system_prompt:
            out.append({"role": "system", "content": self.system_prompt})
        for m in self.messages:
            item: dict[str, object] = {"role": m.role.value, "content": m.content}
            if m.role == Role.ASSISTANT:
                rounds = session_rounds(m.content, m.finish_reason, m.tool_calls)
                if rounds:  # a tool turn: its rounds as the model read them (the answer's text last)
                    for earlier in rounds[:-1]:
                        extra = {"reasoning": "", "thinking": m.thinking, "finish_reason": "stop"} if earlier["role"] == "assistant" else {}
                        out.append({**earlier, **extra})
                    item["content"] = rounds[-1]["content"]
                item.update(reasoning=m.reasoning, thinking=m.thinking, finish_reason=m.finish_reason)
                if m.cache_tokens and not rounds:
                    item["cache_tokens"] = list(m.cache_tokens)
            if m.images and self.pictures is not None:
                item["images"] = list(self.pictures.load(m.images))
            out.append(item)
        return out


@dataclass
class SearchHit:
    conversation_id: int
    conversation_title: str
    message_id: int
    position: int
    role: Role
    snippet: str
    updated: float


def title_from_text(text: str, limit: int = TITLE_LIMIT) -> str:
    """A one-line title from a message: its first non-empty line, whitespace collapsed, cut at a word near `limit`."""
    line = ""
    for raw in text.splitlines():
        candidate = " ".join(raw.split())
        if candidate and not candidate.startswith("```"):
            line = candidate.lstrip("#>*- ").strip() or candidate
            break
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,.;:-") + "…"
