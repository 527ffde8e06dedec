"""Streaming one reply into the history: commits at most once per interval, flushes a stalled stream within it,
and always commits on finish(). A kill -9 therefore loses at most ~interval of the reply in flight."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from typing import Protocol, Sequence

from macapp.core.history.errors import StoreError
from macapp.core.history.records import Message, MessageState, ReplyStats
from macapp.core.jsonvalue import JSONObject

log = logging.getLogger(__name__)

DEFAULT_COMMIT_INTERVAL_S = 1.0


class ReplySink(Protocol):
    """Where a writer commits (the Store)."""

    def save_reply(self, message: Message, *, final: bool) -> bool: ...


class ReplyWriter:
    """Fills in one streaming assistant message: commits at most every `interval` s, and always on finish()."""

    def __init__(self, store: ReplySink, message: Message, interval: float = DEFAULT_COMMIT_INTERVAL_S) -> None:
        self.store = store
        self.message = message
        self.interval = interval
        self.error: BaseException | None = None  # last commit failure (the stream itself carries on)
        self.commits = 0
        self._lock = threading.Lock()
        self._dirty = False
        self._closed = False
        self._last_commit = time.monotonic()
        self._timer: threading.Timer | None = None

    @property
    def message_id(self) -> int:
        return self.message.id

    @property
    def content(self) -> str:
        return self.message.content

    @property
    def reasoning(self) -> str:
        return self.message.reasoning

    @property
    def finished(self) -> bool:
        return self._closed

    def append(self, text: str = "", reasoning: str = "") -> None:
        """Add streamed pieces of answer and/or reasoning."""
        with self._lock:
            self._set(self.message.content + text, self.message.reasoning + reasoning)

    def add_tool_call(self, call: JSONObject) -> None:
        """One more tool call of this reply (events.ToolCallRecord.to_json()), committed now: a call ran."""
        with self._lock:
            if self._closed:
                raise StoreError("This reply is already finished.")
            self.message.tool_calls = [*self.message.tool_calls, call]
            self._dirty = True
            self._flush()

    def update(self, text: str, reasoning: str | None = None) -> None:
        """Replace the reply so far (answer, and reasoning unless None)."""
        with self._lock:
            self._set(text, self.message.reasoning if reasoning is None else reasoning)

    def _set(self, text: str, reasoning: str) -> None:
        if self._closed:
            raise StoreError("This reply is already finished.")
        if text == self.message.content and reasoning == self.message.reasoning:
            return
        self.message.content, self.message.reasoning = text, reasoning
        self._dirty = True
        now = time.monotonic()
        due = self._last_commit + self.interval
        if now >= due:
            self._flush()
        elif self._timer is None:
            # Flush within the interval even if the stream stalls, so a crash loses at most ~interval of text.
            self._timer = threading.Timer(due - now, self._on_timer)
            self._timer.daemon = True
            self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if self._dirty and not self._closed:
                self._flush()

    def _flush(self, final: bool = False) -> None:
        try:
            self.store.save_reply(self.message, final=final)
            self.commits += 1
            self._dirty = False
        except (sqlite3.Error, StoreError) as exc:
            self.error = exc
            log.warning("Could not save the reply in flight: %s", exc)
        self._last_commit = time.monotonic()

    def flush(self) -> None:
        """Commit pending text now."""
        with self._lock:
            if self._dirty and not self._closed:
                self._flush()

    def finish(self, stats: object = None, finish_reason: str | None = None, stopped: bool = False, cache_tokens: Sequence[int] = ()) -> Message:
        """Commit the final text, stats, finish reason, state ('stopped' or 'complete') and the reply's tokens as the
        session's cache held them (events.Reply.cache_tokens); returns the message."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._closed:
                return self.message
            self._closed = True
            self.message.stats = ReplyStats.from_any(stats)
            self.message.finish_reason = finish_reason
            self.message.state = MessageState.STOPPED if stopped else MessageState.COMPLETE
            self.message.cache_tokens = tuple(cache_tokens)
            self.error = None
            self._flush(final=True)
            if self.error is not None:
                raise StoreError(f"Could not save the finished reply: {self.error}") from self.error
            return self.message
