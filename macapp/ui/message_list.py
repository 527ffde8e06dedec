"""The conversation's messages, scrolled: a saved conversation, and the turn in flight as it streams.

A regenerate / edit hides the turn it replaces until the new reply is under way (then removes it); a turn
that never got under way is taken out again and the hidden turn shown — the same rule the recorder applies
to the history (macapp.core.recorder). A saved conversation's pictures are read from the pictures folder and made
small off the GUI thread; each message shows them when they arrive (not if the conversation was left meanwhile).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TypeVar

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QVBoxLayout, QWidget

from macapp.core.events import AnswerDelta, Event, ReasoningDelta, StatsUpdate, TerminalEvent, ToolCallAsked, ToolCallDone, ToolCallRecord, TurnKind
from macapp.core.recorder import TurnResult
from macapp.core.history import Message, Role
from macapp.core.picture_data import ImageRef
from macapp.core.vision import pictures as saved_files
from macapp.core.vision.images import PreparedImage
from macapp.ui import attachments
from macapp.ui.chat_controller import TurnEnd, TurnStart
from macapp.ui.messages import FAILED_NOTE, AssistantMessage, UserMessage, reply_note

log = logging.getLogger(__name__)
M = TypeVar("M", UserMessage, AssistantMessage)


@dataclass(eq=False)
class _Pending:
    """The widgets of the turn in flight, and those of the turn it replaces (hidden meanwhile)."""

    added: list[UserMessage | AssistantMessage] = field(default_factory=list)
    hidden: list[UserMessage | AssistantMessage] = field(default_factory=list)


class MessageList(QScrollArea):
    changed = Signal()  # messages were added or removed
    pictures_shown = Signal()  # a saved message's pictures, read off the GUI thread, are shown
    _pictures_read = Signal(int, object, object, object)  # (shown conversation, its message widget, pictures, previews)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.current: AssistantMessage | None = None  # the reply in flight
        self.renders = 0  # batches rendered while streaming (tests and bench/ui_bench.py compare it with tokens)
        self._pending: _Pending | None = None
        self.container = QWidget()
        self._layout = QVBoxLayout(self.container)
        self._layout.setContentsMargins(4, 4, 12, 4)
        self._layout.setSpacing(10)
        self.empty = QLabel(self.container)
        self.empty.setObjectName("Note")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self._layout.addWidget(self.empty)
        self._layout.addStretch(1)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWidget(self.container)
        self._stick_to_bottom = True
        self.verticalScrollBar().rangeChanged.connect(self._follow)
        self.verticalScrollBar().valueChanged.connect(self._on_scrolled)
        self._shown = 0  # which conversation is shown: pictures read for an earlier one are dropped
        self._pictures_read.connect(self._show_read_pictures)  # queued: emitted from the reading thread

    # -- what is shown ----------------------------------------------------------------------------------------
    def widgets(self) -> list[UserMessage | AssistantMessage]:
        """The message widgets, in order (a replaced turn's hidden ones included while it is pending)."""
        items = (self._layout.itemAt(i) for i in range(1, self._layout.count() - 1))
        return [w for item in items if item is not None and isinstance(w := item.widget(), (UserMessage, AssistantMessage))]

    def last_index(self, role: str) -> int | None:
        widgets = self.widgets()
        return next((i for i in range(len(widgets) - 1, -1, -1) if widgets[i].role == role), None)

    def set_empty_text(self, text: str) -> None:
        self.empty.setText(text)

    def clear(self) -> None:
        self._shown += 1
        for w in self.widgets():
            self._remove(w)
        self.current = None
        self._pending = None
        self._changed()

    def show_conversation(self, messages: list[Message]) -> None:
        self.clear()
        with_pictures: list[tuple[UserMessage, tuple[ImageRef, ...]]] = []
        for m in messages:
            if m.role is Role.USER:
                message = self._add(UserMessage(m.content, self.container))
                if m.images:
                    with_pictures.append((message, m.images))
            elif m.role is Role.ASSISTANT:
                w = AssistantMessage(self.container)
                if m.reasoning:
                    w.add_reasoning(m.reasoning)
                shown = 0
                for record in sorted((ToolCallRecord.from_json(c) for c in m.tool_calls), key=lambda r: r.at):
                    w.add_answer(m.content[shown : record.at])  # the text before the call, then the call
                    w.tool_done(record)
                    shown = max(shown, record.at)
                w.add_answer(m.content[shown:])
                w.finish(m.stats if not m.stats.is_empty() else None, "stopped" if m.stopped else "")
                if w.reasoning is not None:
                    w.reasoning.header.setText("Thought")
                self._add(w)
        self._changed()
        if with_pictures:
            self._read_pictures(with_pictures)

    def _read_pictures(self, messages: list[tuple[UserMessage, tuple[ImageRef, ...]]]) -> None:
        """Read saved messages' pictures (ImageRef) and make their previews on a thread; each message shows its
        own when they arrive."""
        shown = self._shown

        def work() -> None:
            for message, refs in messages:
                try:
                    pictures = saved_files.load_pictures(refs)  # a missing or damaged file is left out (the text stays)
                    previews = tuple(attachments.preview_item(p, attachments.THUMB * 2) for p in pictures)
                    self._pictures_read.emit(shown, message, pictures, previews)
                except RuntimeError:  # the window is gone
                    return
                except Exception:  # noqa: BLE001 - the message is shown without them
                    log.exception("Could not show a saved message's pictures")

        threading.Thread(target=work, name="qwen-desk-read-pictures", daemon=True).start()

    def _show_read_pictures(self, shown: int, message: UserMessage, pictures: tuple[PreparedImage, ...], previews: tuple[QImage, ...]) -> None:
        if shown != self._shown or message not in self.widgets():
            return  # another conversation is shown now (its widgets may be deleted)
        message.show_pictures(pictures, previews)
        self.pictures_shown.emit()

    # -- the turn in flight ------------------------------------------------------------------------------------
    def begin_turn(self, start: TurnStart) -> AssistantMessage:
        """Show the new turn; a regenerate / edit hides the turn it replaces."""
        widgets = self.widgets()
        pending = _Pending()
        last_user = self.last_index("user")
        if start.kind is not TurnKind.SEND and last_user is not None:
            first = last_user + 1 if start.kind is TurnKind.REGENERATE else last_user  # as the session replaces it
            pending.hidden = widgets[first:]
        for w in pending.hidden:
            w.hide()
        if start.kind is not TurnKind.REGENERATE:
            pictures = start.images or self._replaced_pictures(pending.hidden, start)
            pending.added.append(self._add(UserMessage(start.text, self.container, pictures)))
        self.current = self._add(AssistantMessage(self.container))
        pending.added.append(self.current)
        self._pending = pending
        self._stick_to_bottom = True
        self._changed()
        return self.current

    @staticmethod
    def _replaced_pictures(hidden: list[UserMessage | AssistantMessage], start: TurnStart) -> tuple[PreparedImage, ...]:
        """An edit keeps the message's pictures: those of the user message it replaces."""
        if start.kind is TurnKind.EDIT and hidden and isinstance(hidden[0], UserMessage):
            return hidden[0].pictures
        return ()

    def replace_old_turn(self) -> None:
        """The new reply is under way: the turn it replaces goes."""
        if self._pending is not None:
            for w in self._pending.hidden:
                self._remove(w)
            self._pending.hidden = []
            self._changed()

    def show_events(self, batch: list[Event]) -> None:
        """Add a batch's text and stats to the reply in flight; repaint once (the final batch: at settle)."""
        msg = self.current
        if msg is None:
            return
        for event in batch:
            match event:
                case ReasoningDelta(text=text):
                    msg.add_reasoning(text)
                case AnswerDelta(text=text):
                    msg.add_answer(text)
                case StatsUpdate(stats=stats):
                    msg.stats = stats
                case ToolCallAsked():
                    msg.tool_asked(event)
                case ToolCallDone(record=record):
                    msg.tool_done(record)
        if not isinstance(batch[-1], TerminalEvent):
            msg.render_text()
            self.renders += 1

    def settle(self, end: TurnEnd) -> None:
        """The turn ended: finish the reply, or take the turn out again if it never got under way."""
        msg, pending = self.current, self._pending
        self.current = self._pending = None
        if msg is None or pending is None:
            return
        outcome = end.outcome
        if outcome.result is TurnResult.UNDONE:
            for w in pending.added:
                self._remove(w)
            for w in pending.hidden:
                w.show()
        else:
            for w in pending.hidden:
                self._remove(w)
            reply = end.reply
            if outcome.result is TurnResult.FAILED:
                note = FAILED_NOTE
            else:
                note = reply_note(reply.finish_reason if reply else None, reply.budget_hit if reply else False)
            msg.finish(reply.stats if reply is not None else msg.stats, note)
        self._changed()

    def leave_turn(self) -> None:
        """The reply in flight was stopped and will not be shown further: show it as stopped, the old turn again."""
        msg, pending = self.current, self._pending
        self.current = self._pending = None
        if pending is not None:
            for w in pending.hidden:
                w.show()
        if msg is not None:
            msg.finish(msg.stats, "stopped")
        self._changed()

    # -- helpers ------------------------------------------------------------------------------------------------
    def _add(self, widget: M) -> M:
        self._layout.insertWidget(self._layout.count() - 1, widget)
        return widget

    def _remove(self, widget: QWidget) -> None:
        self._layout.removeWidget(widget)
        widget.hide()  # deleteLater waits for the event loop; until then it would still paint over the new turn
        widget.deleteLater()

    def _changed(self) -> None:
        self.empty.setVisible(not self.widgets())
        self.changed.emit()

    def _on_scrolled(self, value: int) -> None:
        self._stick_to_bottom = value >= self.verticalScrollBar().maximum() - 24

    def _follow(self, _lo: int, hi: int) -> None:
        if self._stick_to_bottom:
            self.verticalScrollBar().setValue(hi)
