"""Record a streamed chat into the history store from the engine's events (no MLX, no Qt: usable anywhere).

Use, per turn (the chat CLI and the window alike):

    recorder = ChatRecorder(store, model="Qwen3.5-4B", system_prompt=..., settings=...)  # or ChatRecorder.resume(store, id)
    recorder.user(text, thinking=True)          # commits the user message BEFORE generation starts
    job = session.send(text, thinking=True, ...)
    recorder.begin_assistant()                  # optional: commits an empty 'streaming' reply row now
    job.add_listener(recorder.on_event)         # or: for event in job.events(): recorder.on_event(event)

`on_event` takes ReasoningDelta / AnswerDelta / StatsUpdate / Finished / Failed (macapp.core.events) by class
name, ignores the rest, and never raises (it may run on the engine's worker thread): a storage failure is
logged and kept in `recorder.error`. Deltas are committed at most once a second and always at the end.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from typing import Any

from macapp.core.history import DEFAULT_COMMIT_INTERVAL_S, Message, ReplyWriter, Store, StoreError

log = logging.getLogger(__name__)


class ChatRecorder:
    """Mirrors one conversation's turns into the store; the conversation is created on the first user message."""

    def __init__(
        self,
        store: Store,
        conversation_id: int | None = None,
        *,
        model: str = "",
        system_prompt: str | None = None,
        settings: dict[str, Any] | None = None,
        interval: float = DEFAULT_COMMIT_INTERVAL_S,
    ) -> None:
        self.store = store
        self.conversation_id = conversation_id
        self.model = model
        self.system_prompt = system_prompt
        self.settings = dict(settings or {})
        self.interval = interval
        self.error: BaseException | None = None  # the last storage failure seen by on_event
        self.last_reply: Message | None = None  # the last finished reply
        self._writer: ReplyWriter | None = None
        self._thinking = False
        self._turn_over = False  # the reply ended: stray deltas (e.g. fed after Finished) must not start another
        self._lock = threading.RLock()

    @classmethod
    def resume(cls, store: Store, conversation_id: int, **kwargs: Any) -> ChatRecorder:
        """Continue a saved conversation (NotFoundError if it is gone); model/system prompt/settings default to its own."""
        conv = store.get_conversation(conversation_id)
        kwargs.setdefault("model", conv.model)
        kwargs.setdefault("system_prompt", conv.system_prompt)
        kwargs.setdefault("settings", conv.settings)
        return cls(store, conversation_id, **kwargs)

    @property
    def in_reply(self) -> bool:
        return self._writer is not None

    # -- turns

    def user(self, text: str, *, thinking: bool = False) -> Message:
        """Commit the user's message (creating the conversation first if needed). Raises StoreError on failure."""
        with self._lock:
            self._abandon_reply()
            if self.conversation_id is None:
                conv = self.store.create_conversation(self.model, self.system_prompt, self.settings)
                self.conversation_id = conv.id
            self._thinking = thinking
            self._turn_over = False
            return self.store.add_message(self.conversation_id, "user", text)

    def begin_assistant(self, thinking: bool | None = None, model: str | None = None) -> ReplyWriter:
        """Commit an empty reply in state 'streaming' (done lazily by the first delta if not called)."""
        with self._lock:
            if self.conversation_id is None:
                raise StoreError("Record the user's message (recorder.user) before the reply.")
            self._abandon_reply()
            self._turn_over = False
            if model:
                self.model = model
            self._writer = self.store.begin_reply(
                self.conversation_id,
                thinking=self._thinking if thinking is None else thinking,
                model=self.model or None,
                interval=self.interval,
            )
            return self._writer

    def on_delta(self, text: str = "", reasoning: str = "") -> None:
        with self._lock:
            if self._writer is None and self._turn_over:
                log.debug("Ignored a text piece that came after its reply ended")
                return
            writer = self._writer or self.begin_assistant()
            writer.append(text, reasoning)

    def finish(
        self,
        stats: Any = None,
        finish_reason: str | None = "stop",
        stopped: bool = False,
        text: str | None = None,
        reasoning: str | None = None,
    ) -> Message:
        """Commit the reply's final text (if given, it replaces the streamed text), stats and state."""
        with self._lock:
            writer = self._writer or self.begin_assistant()
            if text is not None or reasoning is not None:
                writer.update(writer.content if text is None else text, reasoning)
            self._writer = None
            self._turn_over = True
            self.last_reply = writer.finish(stats, finish_reason, stopped)
            return self.last_reply

    def fail(self, message: str = "") -> Message | None:
        """End the reply after an engine failure: kept as stopped ('error') if it has text, else removed."""
        with self._lock:
            writer, self._writer = self._writer, None
            self._turn_over = True
            if writer is None:
                return None
            if writer.content or writer.reasoning:
                self.last_reply = writer.finish(None, "error", stopped=True)
                return self.last_reply
            writer.finish(None, "error", stopped=True)
            self.store.truncate(writer.message.conversation_id, writer.message.position)
            return None

    def on_event(self, event: Any) -> None:
        """Feed one engine event; never raises."""
        kind = type(event).__name__
        try:
            if kind == "AnswerDelta":
                self.on_delta(text=event.text)
            elif kind == "ReasoningDelta":
                self.on_delta(reasoning=event.text)
            elif kind == "Finished":
                reply = event.reply
                if not getattr(reply, "kept", True) and not (reply.text or reply.reasoning):
                    self.fail()  # stopped while the prompt was read: no reply to keep
                else:
                    self.finish(
                        stats=reply.stats,
                        finish_reason=reply.finish_reason,
                        stopped=reply.finish_reason == "stopped",
                        text=reply.text,
                        reasoning=reply.reasoning,
                    )
            elif kind == "Failed":
                self.fail(getattr(event, "message", ""))
        except (StoreError, sqlite3.Error) as exc:
            self.error = exc
            log.warning("Could not record the chat: %s", exc)

    # -- editing the last turn (mirror Session.regenerate / edit_last)

    def discard_last_reply(self) -> None:
        """Remove the last assistant reply (call before regenerating it); the next events record the new one."""
        with self._lock:
            self._abandon_reply()
            self._turn_over = False
            last = self._last_message()
            if last is not None and last.role == "assistant":
                self.store.truncate(self.conversation_id, last.position)

    def edit_last_user(self, text: str, *, thinking: bool = False) -> Message:
        """Replace the last user message (and the reply after it) with `text`; commits before generation."""
        with self._lock:
            self._abandon_reply()
            if self.conversation_id is not None:
                messages = self.store.get_conversation(self.conversation_id).messages
                last_user = next((m for m in reversed(messages) if m.role == "user"), None)
                if last_user is not None:
                    self.store.truncate(self.conversation_id, last_user.position)
            return self.user(text, thinking=thinking)

    def retract_last_user(self) -> str | None:
        """Remove the last message if it is an unanswered user message (e.g. put back in the composer); returns its text."""
        with self._lock:
            last = self._last_message()
            if last is None or last.role != "user":
                return None
            self.store.truncate(self.conversation_id, last.position)
            return last.content

    def set_model(self, model: str) -> None:
        """The model changed: later replies and the conversation record it."""
        with self._lock:
            self.model = model
            if self.conversation_id is not None:
                self.store.update_conversation(self.conversation_id, model=model)

    def _last_message(self) -> Message | None:
        if self.conversation_id is None:
            return None
        messages = self.store.get_conversation(self.conversation_id).messages
        return messages[-1] if messages else None

    def _abandon_reply(self) -> None:
        """A reply still open when the next turn starts was never finished: keep its text as stopped."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.finish(None, "abandoned", stopped=True)
