"""The one recorder: a chat turn's engine events in, the conversation's history rows out (no MLX, no Qt).

Every front end that keeps a history records the same way (the window, `qwen-desk chat`; the local API server
records nothing), through the conversation model (macapp.core.conversation), which feeds a turn's events to it on
a recording thread of its own, never on the GUI thread; mirroring the session:

    recorder = ChatRecorder(store, model="Qwen3.5-4B", system_prompt=..., settings=...)  # or ChatRecorder.resume(store, id)
    turn = recorder.begin(TurnKind.SEND, text, thinking=True)   # a send commits the user message now
    job = run_on(session, TurnKind.SEND, text, thinking=True)    # session.send / regenerate / edit_last
    for event in job.events(): turn.feed(event)                  # or job.add_listener(turn.feed), or coalesced batches
    outcome = turn.outcome                                       # set by the terminal event (Finished / Failed)

The rules, here once:
- A send commits its user message before generation (a crash never loses what was typed); the reply row is
  created when the reply is under way (its first text piece, or a kept Finished) and committed at most once a
  second while it streams, and at the end with the final text (which wins over the streamed pieces).
- A regenerate / edit keeps the old turn in the history until the new reply is under way; only then is it
  replaced (an edit's new message saved with it). A turn that never got under way (refused, failed before any
  text, stopped while the prompt was read: Finished with kept False) is UNDONE: a send's message is taken back
  (and a conversation it created is deleted), a regenerate/edit leaves the old turn as it was.
- A reply stopped by the user is kept with state 'stopped', finish_reason 'stopped'. A reply the engine failed
  in the middle of is kept the same way with finish_reason 'error' (what was said is never lost); its Failed
  message is the outcome's `error`. Whichever front end ran the turn, the rows are the same.
- `feed` never raises (it may run on the engine's worker thread): a storage failure is logged and kept in
  `recorder.error`. After an UNDONE or FAILED turn, a front end whose session no longer agrees with the history
  (`recorder.agrees_with(session.messages)` False) opens a new session from the history before the next turn.
"""

from __future__ import annotations

import enum
import logging
import sqlite3
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from macapp.core.events import AnswerDelta, Event, Failed, Finished, ReasoningDelta, TerminalEvent, ToolCallDone, TurnKind
from macapp.core.history import DEFAULT_COMMIT_INTERVAL_S, Message, ReplyWriter, Role, Store, StoreError
from macapp.core.jsonvalue import JSONObject
from macapp.core.vision.pictures import save_picture

if TYPE_CHECKING:
    from macapp.core.engine.jobs import Job
    from macapp.core.engine.session import ChatSession
    from macapp.core.vision.images import PreparedImage
    from macapp.core.vision.refs import ImageRef

log = logging.getLogger(__name__)

ERROR_REASON = "error"  # finish_reason of a reply the engine failed in the middle of
ABANDONED_REASON = "abandoned"  # finish_reason of a reply still open when the next turn began (or the app closed)


class TurnResult(enum.Enum):
    COMPLETE = "complete"  # the reply ended on its own (end of turn, max tokens, context full)
    STOPPED = "stopped"  # stopped by the user: what was written is kept
    FAILED = "failed"  # the engine failed mid-reply: what was written is kept (finish_reason 'error')
    UNDONE = "undone"  # no reply: refused, failed before any text, or stopped while the prompt was read


@dataclass(frozen=True)
class TurnOutcome:
    kind: TurnKind
    result: TurnResult
    text: str = ""  # the user's text of a send / edit
    reply: Message | None = None  # the recorded reply (COMPLETE, STOPPED, FAILED)
    error: str | None = None  # the engine's Failed message
    code: str | None = None  # the engine's Failed code

    @property
    def kept(self) -> bool:
        return self.result is not TurnResult.UNDONE

    @property
    def give_back(self) -> str | None:
        """What the user typed for a turn that did not happen (to put back in their input), else None."""
        if self.result is TurnResult.UNDONE and self.kind in (TurnKind.SEND, TurnKind.EDIT):
            return self.text
        return None


def run_on(session: ChatSession, kind: TurnKind, text: str = "", **options: Any) -> Job:
    """The session's job for a turn of this kind (send / regenerate / edit_last), with the same options."""
    if kind is TurnKind.REGENERATE:
        return session.regenerate(**options)
    if kind is TurnKind.EDIT:
        return session.edit_last(text, **options)
    return session.send(text, **options)


def _saved(images: tuple[PreparedImage, ...]) -> tuple[ImageRef, ...]:
    if not images:
        return ()
    return tuple(save_picture(image) for image in images)


class ChatRecorder:
    """Mirrors one conversation's turns into the store; the conversation is created by its first sent message."""

    def __init__(
        self,
        store: Store,
        conversation_id: int | None = None,
        *,
        model: str = "",
        system_prompt: str | None = None,
        settings: JSONObject | None = None,
        interval: float = DEFAULT_COMMIT_INTERVAL_S,
    ) -> None:
        self.store = store
        self.conversation_id = conversation_id
        self.model = model
        self.system_prompt = system_prompt
        self.settings = dict(settings or {})
        self.interval = interval
        self.error: BaseException | None = None  # the last storage failure seen while feeding events
        self.last_reply: Message | None = None  # the last recorded reply
        self._turn: RecordedTurn | None = None  # the turn in flight
        self._lock = threading.RLock()

    @classmethod
    def resume(cls, store: Store, conversation_id: int, **kwargs: Any) -> ChatRecorder:
        """Continue a saved conversation (NotFoundError if it is gone); model/system prompt/settings default to its own."""
        conv = store.get_conversation(conversation_id)
        kwargs.setdefault("model", conv.model)
        kwargs.setdefault("system_prompt", conv.system_prompt)
        kwargs.setdefault("settings", conv.settings)
        return cls(store, conversation_id, **kwargs)

    def begin(self, kind: TurnKind, text: str = "", *, thinking: bool = False, images: tuple[PreparedImage, ...] = ()) -> RecordedTurn:
        """Start recording a turn, before the session runs it. A send commits the user message now (creating
        the conversation if needed; raises StoreError when that fails), its `images` (vision.images.PreparedImage)
        saved into the pictures folder and referenced from it. A turn still open is abandoned (kept)."""
        with self._lock:
            if self._turn is not None:
                self._turn.abandon()
            turn = RecordedTurn(self, kind, text, thinking)
            if kind is TurnKind.SEND:
                turn._created_conversation = self.conversation_id is None
                self.store.add_message(self._ensure_conversation(), Role.USER, text, images=_saved(images))
            self._turn = turn
            return turn

    def agrees_with(self, messages: Sequence[Mapping[str, object]]) -> bool:
        """True when the history holds the same turns as `messages` (a session's, role/content/reasoning dicts)."""

        def key(m: Mapping[str, object]) -> tuple[str, str, str]:
            return str(m["role"]), str(m.get("content") or ""), str(m.get("reasoning") or "")

        want = [key(m) for m in messages if m["role"] != "system"]
        if self.conversation_id is None:
            return not want
        have = [key(m) for m in self.store.get_conversation(self.conversation_id).chat_messages(include_system=False)]
        return have == want

    # -- used by RecordedTurn, under the lock

    def _ensure_conversation(self) -> int:
        if self.conversation_id is None:
            self.conversation_id = self.store.create_conversation(self.model, self.system_prompt, self.settings).id
        return self.conversation_id

    def _messages(self) -> list[Message]:
        return [] if self.conversation_id is None else self.store.get_conversation(self.conversation_id).messages

    def _last_user(self) -> Message | None:
        return next((m for m in reversed(self._messages()) if m.role is Role.USER), None)

    def _turn_ended(self, turn: RecordedTurn) -> None:
        if self._turn is turn:
            self._turn = None


class RecordedTurn:
    """One turn being recorded: feed it the job's events (raw or coalesced, any thread) until the terminal one."""

    def __init__(self, recorder: ChatRecorder, kind: TurnKind, text: str, thinking: bool) -> None:
        self.recorder = recorder
        self.kind = kind
        self.text = text
        self.thinking = thinking
        self.outcome: TurnOutcome | None = None  # set when the terminal event has been recorded
        self._writer: ReplyWriter | None = None  # the reply row, while it streams
        self._under_way = False
        self._created_conversation = False

    @property
    def under_way(self) -> bool:
        """The new reply has begun (and, for a regenerate / edit, has replaced the old turn in the history)."""
        return self._under_way

    @property
    def settled(self) -> bool:
        return self.outcome is not None

    def feed(self, event: Event) -> None:
        """Record one engine event; never raises. Events after the terminal one are ignored."""
        with self.recorder._lock:
            if self.outcome is not None:
                return
            try:
                match event:
                    case AnswerDelta(text=text):
                        self._start_reply().append(text=text)
                    case ReasoningDelta(text=text):
                        self._start_reply().append(reasoning=text)
                    case ToolCallDone(record=record):
                        self._start_reply().add_tool_call(record.to_json())
                    case Finished(reply=reply) if reply.kept:
                        writer = self._start_reply()
                        writer.update(reply.text, reply.reasoning)
                        stopped = reply.finish_reason == "stopped"
                        message = writer.finish(reply.stats, reply.finish_reason, stopped=stopped, cache_tokens=reply.cache_tokens)
                        self._settle(TurnResult.STOPPED if stopped else TurnResult.COMPLETE, message)
                    case Finished():
                        self._undo()
                    case Failed(message=text, code=code) if self._writer is not None:
                        kept = self._writer.finish(None, ERROR_REASON, stopped=True)
                        self._settle(TurnResult.FAILED, kept, error=text, code=code)
                    case Failed(message=text, code=code):
                        self._undo(error=text, code=code)
                    case TerminalEvent():
                        log.warning("A chat turn ended with an unexpected %r", event)
                        self._undo()
            except (StoreError, sqlite3.Error) as exc:
                self.recorder.error = exc
                log.warning("Could not record the chat: %s", exc)
                if isinstance(event, TerminalEvent) and self.outcome is None:
                    self._settle(TurnResult.FAILED if self._under_way else TurnResult.UNDONE, None)

    def abandon(self) -> None:
        """The turn will get no more events (the next turn began, the app closes): keep what it wrote as stopped."""
        with self.recorder._lock:
            if self.outcome is not None:
                return
            try:
                if self._writer is not None:
                    self._settle(TurnResult.STOPPED, self._writer.finish(None, ABANDONED_REASON, stopped=True))
                else:
                    self._settle(TurnResult.UNDONE, None)
            except (StoreError, sqlite3.Error) as exc:
                self.recorder.error = exc
                log.warning("Could not record the chat: %s", exc)

    # -- under the recorder's lock

    def _start_reply(self) -> ReplyWriter:
        """The reply is under way: replace the old turn (regenerate / edit) and open the reply row, once."""
        if self._writer is not None:
            return self._writer
        rec = self.recorder
        if self.kind is not TurnKind.SEND:
            last_user = rec._last_user()
            if self.kind is TurnKind.REGENERATE:
                if last_user is None:
                    raise StoreError("Record the user's message before the reply: there is none to answer again.")
                rec.store.truncate(last_user.conversation_id, last_user.position + 1)
            else:
                if last_user is not None:
                    rec.store.truncate(last_user.conversation_id, last_user.position)
                rec.store.add_message(rec._ensure_conversation(), Role.USER, self.text)
        self._writer = rec.store.begin_reply(rec._ensure_conversation(), thinking=self.thinking, model=rec.model or None, interval=rec.interval)
        self._under_way = True
        return self._writer

    def _undo(self, error: str | None = None, code: str | None = None) -> None:
        """No reply: take back what this turn wrote (a send's message; a reply row opened by a kept=False end)."""
        rec = self.recorder
        if self._writer is not None:
            message = self._writer.finish(None, None, stopped=True)
            rec.store.truncate(message.conversation_id, message.position)
        if self.kind is TurnKind.SEND and rec.conversation_id is not None:
            last_user = rec._last_user()
            if last_user is not None and last_user.content == self.text:
                rec.store.truncate(rec.conversation_id, last_user.position)
            if self._created_conversation and not rec._messages():
                rec.store.delete(rec.conversation_id)  # its only message was taken back: no empty conversation
                rec.conversation_id = None
        self._settle(TurnResult.UNDONE, None, error=error, code=code)

    def _settle(self, result: TurnResult, reply: Message | None, error: str | None = None, code: str | None = None) -> None:
        self._writer = None
        self.outcome = TurnOutcome(self.kind, result, self.text, reply, error, code)
        if reply is not None:
            self.recorder.last_reply = reply
        self.recorder._turn_ended(self)
