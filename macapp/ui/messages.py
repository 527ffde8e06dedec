"""Message widgets for the conversation: user bubble, assistant reply with a collapsible reasoning block."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QTextDocument
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from macapp.core.events import GenerationStats, ToolCallAsked, ToolCallRecord
from macapp.core.history import ReplyStats
from macapp.core.picture_data import ImageRef
from macapp.core.vision import pictures as saved_files
from macapp.core.vision.images import PreparedImage
from macapp.core.vision.video import PreparedVideo
from macapp.ui.attachments import THUMB, VIDEO_WIDTH, pixmap_of, preview_of, video_caption
from macapp.ui.meter import stats_summary
from macapp.ui.tools import ToolCallBlock, asked_block
from macapp.ui.widgets import CollapsibleFrame, MarkdownView

# Why a reply ended, when it is worth saying (by the engine's finish_reason).
ENDINGS = {
    "stopped": "stopped",
    "length": "cut off at the max tokens limit",
    "context": "the context is full: start a new chat to go on",
    "tool_rounds": "tool-call round limit",
}
FAILED_NOTE = "stopped by an error"


def reply_note(finish_reason: str | None, budget_hit: bool = False) -> str:
    """The note after a reply's stats: why it ended (if not at its natural end), and a reached thinking budget."""
    notes = [ENDINGS.get(finish_reason or "", ""), "thinking budget reached" if budget_hit else ""]
    return " · ".join(filter(None, notes))


class ReasoningBlock(CollapsibleFrame):
    """'Thinking…' while reasoning streams; 'Thought for 12 s' and collapsed once the answer starts."""

    body: MarkdownView

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("ReasoningBox", parent)
        self.body = MarkdownView(self, muted=True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.header, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(self.body)
        self.text = ""
        self.seconds: float | None = None
        self._started = time.monotonic()
        self.header.setText("Thinking…")
        self.header.setChecked(True)
        self.set_expanded(True)

    def append(self, text: str) -> None:
        self.text += text

    def render_text(self) -> None:
        """Add what arrived since the last render (no rebuild of the whole text while it streams)."""
        shown = self.body.source_text
        if self.text.startswith(shown):
            self.body.append_plain(self.text[len(shown) :] if shown else self.text.lstrip())
        else:
            self.body.set_plain(self.text.strip())

    def finish(self, seconds: float | None = None) -> None:
        """The answer began (or the reply ended): show the duration and fold the block away."""
        if self.seconds is not None:
            return
        self.seconds = seconds if seconds is not None else time.monotonic() - self._started
        self.body.set_plain(self.text.strip())
        self.header.setText(f"Thought for {self.seconds:.0f} s" if self.seconds >= 1 else "Thought for a moment")
        self.header.setChecked(False)


def saved_pictures(refs: tuple[ImageRef, ...]) -> tuple[PreparedImage, ...]:
    """A saved message's pictures, read back from the pictures folder (a missing file is left out)."""
    if not refs:
        return ()
    return saved_files.load_pictures(refs)


class UserMessage(QFrame):
    def __init__(self, text: str, parent: QWidget | None = None, pictures: tuple[PreparedImage, ...] = ()) -> None:
        super().__init__(parent)
        self.role = "user"
        self.text = text
        self.pictures: tuple[PreparedImage, ...] = ()  # vision.images.PreparedImage, shown as thumbnails above the text
        self.thumbnails: list[QLabel] = []
        self.bubble = bubble = QFrame(self)
        bubble.setObjectName("UserBubble")
        self.view = MarkdownView(bubble)
        self.view.set_plain(text)
        self._inner = QVBoxLayout(bubble)
        self._inner.setContentsMargins(12, 6, 12, 6)
        self._inner.addWidget(self.view)
        # Hug the text: as wide as its longest line, wrapping only past the available width.
        probe = QTextDocument()
        probe.setDefaultFont(self.view.font())
        probe.setPlainText(text)
        self._text_width = int(probe.idealWidth())
        bubble.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.show_pictures(pictures)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(80, 4, 0, 4)
        lay.addStretch(1)
        lay.addWidget(bubble, 100)

    def show_pictures(self, pictures: tuple[PreparedImage, ...], previews: tuple[QImage, ...] = ()) -> None:
        """Show the message's pictures above its text (once); `previews`: their small QImages (attachments.preview),
        made off the GUI thread for a reopened conversation."""
        if pictures and not self.pictures:
            self.pictures = tuple(pictures)
            row = QHBoxLayout()
            row.setSpacing(6)
            for i, picture in enumerate(self.pictures):
                small = previews[i] if i < len(previews) else preview_of(picture, THUMB * 2)
                label = QLabel(self.bubble)
                video = isinstance(picture, PreparedVideo)
                label.setPixmap(pixmap_of(small, THUMB * 2, VIDEO_WIDTH * 2 if video else None))
                label.setToolTip(f"{picture.name} — {video_caption(picture) if isinstance(picture, PreparedVideo) else f'{picture.size[0]}×{picture.size[1]}'}")
                row.addWidget(label)
                self.thumbnails.append(label)
            row.addStretch(1)
            self._inner.insertLayout(0, row)
        pictures_width = sum(label.pixmap().width() + 6 for label in self.thumbnails)
        self.bubble.setMaximumWidth(max(self._text_width, pictures_width) + 24 + 12)


class AssistantMessage(QFrame):
    """A streaming reply: text accumulates on every delta, the widgets re-render once per delivered batch.
    A tool call made after some answer text ends that text's view: the call's block, then a new view for what
    follows, so text and calls show in the order the model wrote them (`views`; `view` is the last)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.role = "assistant"
        self.answer = ""
        self.reasoning: ReasoningBlock | None = None
        self.tool_calls: list[ToolCallBlock] = []
        self.stats: GenerationStats | ReplyStats | None = None
        self._dirty_answer = False
        self._dirty_reasoning = False
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 4, 40, 4)
        self._lay.setSpacing(4)
        self.view = MarkdownView(self)
        self.stats_label = QLabel(self)
        self.stats_label.setObjectName("MessageStats")
        self.stats_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stats_label.hide()
        self._lay.addWidget(self.view)
        self._lay.addWidget(self.stats_label)
        self.view.set_plain("")
        self.views = [self.view]
        self._view_start = 0  # where the last view's text starts in `answer`

    def tool_asked(self, event: ToolCallAsked) -> None:
        """A call the model made: its block, waiting for the approval and the result."""
        self._add_call(asked_block(event, self))

    def tool_done(self, record: ToolCallRecord) -> None:
        block = next((b for b in self.tool_calls if b.call_id == record.call_id and b.record is None), None)
        if block is None:
            self._add_call(ToolCallBlock.of(record, self))
        else:
            block.finish(record)

    def _add_call(self, block: ToolCallBlock) -> None:
        self.tool_calls.append(block)
        if not self.answer[self._view_start :].strip():  # no text since the last call: the block goes above the view
            self._lay.insertWidget(self._lay.indexOf(self.view), block)
            return
        self.render_text(final=True)  # the text before the call is done: its view, then the block, then a new view
        at = self._lay.indexOf(self.view) + 1
        self._lay.insertWidget(at, block)
        self.view = MarkdownView(self)
        self.view.set_plain("")
        self._lay.insertWidget(at + 1, self.view)
        self.views.append(self.view)
        self._view_start = len(self.answer)

    def _ensure_reasoning(self) -> ReasoningBlock:
        if self.reasoning is None:
            self.reasoning = ReasoningBlock(self)
            self._lay.insertWidget(0, self.reasoning)
        return self.reasoning

    def add_reasoning(self, text: str) -> None:
        self._ensure_reasoning().append(text)
        self._dirty_reasoning = True

    def add_answer(self, text: str) -> None:
        if not self.answer and self.reasoning is not None and not text.strip():
            return  # whitespace between </think> and the answer
        if self.reasoning is not None and self.reasoning.seconds is None:
            self.reasoning.finish()
        self.answer += text
        self._dirty_answer = True

    def render_text(self, final: bool = False) -> None:
        """Repaint what changed since the last batch (called at most a few tens of times a second)."""
        if self._dirty_reasoning and self.reasoning is not None and self.reasoning.expanded:
            self.reasoning.render_text()
        if self._dirty_answer or final:
            text = self.answer[self._view_start :].lstrip("\n")
            # While streaming only the new part is laid out; the finished reply is rendered whole, exactly.
            self.view.set_markdown(text) if final else self.view.stream_markdown(text)
        self._dirty_answer = self._dirty_reasoning = False

    def set_stats(self, stats: GenerationStats | ReplyStats | None, note: str = "") -> None:
        self.stats = stats
        text = stats_summary(stats)
        if note:
            text = f"{text} · {note}" if text else note
        self.stats_label.setText(text)
        self.stats_label.setVisible(bool(text))

    def finish(self, stats: GenerationStats | ReplyStats | None = None, note: str = "") -> None:
        if self.reasoning is not None:
            self.reasoning.finish()
        self.render_text(final=True)
        if stats is not None or note:
            self.set_stats(stats if stats is not None else self.stats, note)
