"""Rows <-> records, in one place: the messages columns come from the Message and ReplyStats fields."""

from __future__ import annotations

import array
import json
import sqlite3
import sys
from dataclasses import fields

from macapp.core.history.db import SQLValue
from macapp.core.history.records import STAT_FIELDS, Conversation, Message, MessageState, ReplyStats, Role
from macapp.core.jsonvalue import JSONObject
from macapp.core.picture_data import refs_from_json, refs_to_json

# A message row: every Message field but `stats`, whose fields are columns of their own.
MESSAGE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Message) if f.name != "stats")
MESSAGE_COLUMNS: tuple[str, ...] = MESSAGE_FIELDS + STAT_FIELDS
INSERT_MESSAGE = f"INSERT INTO messages ({', '.join(MESSAGE_COLUMNS)}) VALUES ({', '.join('?' * len(MESSAGE_COLUMNS))})"
SELECT_MESSAGES = f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages"
# A finished reply: its text, state, finish reason and figures.
FINISH_REPLY = (
    "UPDATE messages SET "
    + ", ".join(f"{name} = ?" for name in ("content", "reasoning", "tool_calls", "state", "finish_reason", "cache_tokens", *STAT_FIELDS))
    + " WHERE id = ?"
)
# A reply in flight: its text so far and its tool calls.
STREAM_REPLY = "UPDATE messages SET content = ?, reasoning = ?, tool_calls = ?, state = 'streaming' WHERE id = ?"
SELECT_CONVERSATIONS = "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) AS message_count FROM conversations c"


def stats_values(stats: ReplyStats) -> tuple[SQLValue, ...]:
    return tuple(getattr(stats, name) for name in STAT_FIELDS)


def message_values(m: Message, *, id: int | None, conversation_id: int, position: int) -> tuple[SQLValue, ...]:
    """The row for `m` in MESSAGE_COLUMNS order, under the given id (None: a new one), conversation and position."""
    values = {name: getattr(m, name) for name in MESSAGE_FIELDS}
    values.update(
        id=id,
        conversation_id=conversation_id,
        position=position,
        reasoning=m.reasoning or "",
        thinking=int(m.thinking),
        images=refs_to_json(m.images),
        tool_calls=calls_json(m.tool_calls),
        cache_tokens=tokens_blob(m.cache_tokens),
    )
    return tuple(values[name] for name in MESSAGE_FIELDS) + stats_values(m.stats)


def finish_values(m: Message) -> tuple[SQLValue, ...]:
    """Parameters of FINISH_REPLY for `m`."""
    return (m.content, m.reasoning, calls_json(m.tool_calls), m.state, m.finish_reason, tokens_blob(m.cache_tokens), *stats_values(m.stats), m.id)


def stream_values(m: Message) -> tuple[SQLValue, ...]:
    """Parameters of STREAM_REPLY for `m`."""
    return (m.content, m.reasoning, calls_json(m.tool_calls), m.id)


def calls_json(calls: list[JSONObject]) -> str:
    return json.dumps(calls, ensure_ascii=False)


def calls_from_json(text: str | None) -> list[JSONObject]:
    try:
        calls = json.loads(text or "[]")
    except ValueError:
        return []
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def tokens_blob(tokens: tuple[int, ...]) -> bytes | None:
    """Token ids as little-endian uint32s (None for none)."""
    if not tokens:
        return None
    packed = array.array("I", tokens)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def tokens_from_blob(blob: object) -> tuple[int, ...]:
    """tokens_blob's ids back; () for NULL or a blob that is not whole uint32s."""
    if not isinstance(blob, bytes) or len(blob) % 4:
        return ()
    packed = array.array("I")
    packed.frombytes(blob)
    if sys.byteorder == "big":
        packed.byteswap()
    return tuple(packed)


def message_from_row(row: sqlite3.Row) -> Message:
    values = {name: row[name] for name in MESSAGE_FIELDS}
    values.update(thinking=bool(values["thinking"]), role=Role(values["role"]), state=MessageState(values["state"]), images=refs_from_json(values["images"]))
    values["tool_calls"] = calls_from_json(values["tool_calls"])
    values["cache_tokens"] = tokens_from_blob(values["cache_tokens"])
    return Message(**values, stats=ReplyStats(**{name: row[name] for name in STAT_FIELDS}))


def settings_json(settings: JSONObject | None) -> str:
    return json.dumps(settings or {}, sort_keys=True)


def conversation_from_row(row: sqlite3.Row) -> Conversation:
    try:
        settings = json.loads(row["settings"] or "{}")
    except ValueError:
        settings = {}
    return Conversation(
        id=row["id"],
        title=row["title"],
        model=row["model"],
        created=row["created"],
        updated=row["updated"],
        system_prompt=row["system_prompt"],
        settings=settings if isinstance(settings, dict) else {},
        message_count=row["message_count"],
    )
