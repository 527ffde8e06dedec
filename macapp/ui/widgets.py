"""Small reusable widgets: auto-height Markdown view, fit badge pill, stacked memory bar, elided label."""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, QSizeF, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QPainter,
    QPaintEvent,
    QPalette,
    QResizeEvent,
    QTextBlockFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
)
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QTextBrowser, QToolButton, QWidget

from macapp.ui.style import BADGE_TEXT, badge_colour


def stable_prefix_end(text: str) -> int:
    """Where the finished part of a streaming Markdown text ends: after its last blank line outside a code fence."""
    end = 0
    in_fence = False
    pos = 0
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            in_fence = not in_fence
        pos += len(line)
        if not in_fence and not stripped and line.endswith("\n") and pos < len(text):
            end = pos
    return end


class MarkdownView(QTextBrowser):
    """A read-only text view that grows to fit its content (no inner scroll bar) and renders Markdown."""

    def __init__(self, parent: QWidget | None = None, muted: bool = False) -> None:
        super().__init__(parent)
        self.setObjectName("Bubble")
        self.setOpenExternalLinks(True)
        self.setFrameShape(QTextBrowser.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(2)
        self._mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        if muted:
            pal = self.palette()
            pal.setColor(QPalette.ColorRole.Text, pal.color(QPalette.ColorRole.PlaceholderText))
            self.setPalette(pal)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self.source_text = ""
        self.renders = 0  # how many times the document was rebuilt (tests count repaints by it)
        self._stable_len = 0  # characters of source_text rendered for good (stream_markdown)
        self._stable_pos: int | None = 0  # document position where the re-rendered tail starts

    def set_markdown(self, text: str) -> None:
        self.source_text = text
        self.renders += 1
        self.setMarkdown(text)
        self._style_code_blocks()
        self._stable_len = len(text)
        self._stable_pos = None

    def stream_markdown(self, text: str) -> None:
        """Render a growing Markdown text cheaply: finished blocks are added once, only the open tail is redone.

        A full setMarkdown costs time in proportion to the whole reply (tens of ms for long ones), which would
        stall the event loop while streaming; this costs the new part only. Call set_markdown() at the end
        for the exact rendering (lists or tables split across blank lines come out right then).
        """
        if self._stable_pos is None or not text.startswith(self.source_text[: self._stable_len]):
            self.document().clear()
            self._stable_len, self._stable_pos = 0, 0
        self.source_text = text
        self.renders += 1
        cut = stable_prefix_end(text)
        doc = self.document()
        cursor = QTextCursor(doc)
        cursor.beginEditBlock()
        cursor.setPosition(self._stable_pos)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        if cut > self._stable_len:
            self._insert_block(cursor, text[self._stable_len : cut])
            self._stable_len = cut
            cursor.movePosition(QTextCursor.MoveOperation.End)
            self._stable_pos = cursor.position()
        tail = text[self._stable_len :]
        if tail.strip():
            self._insert_block(cursor, tail)
        cursor.endEditBlock()

    def _insert_block(self, cursor: QTextCursor, markdown: str) -> None:
        start = cursor.position()
        part = QTextDocument()
        part.setMarkdown(markdown)
        # An inserted fragment's first block merges into the cursor's block: give that block the fragment's
        # first format, or a code fence, quote or heading opening the part would lose its formatting.
        first = part.begin()
        if start > 0:
            cursor.insertBlock(first.blockFormat(), first.charFormat())
        else:
            cursor.setBlockFormat(first.blockFormat())
        opened = cursor.block()
        cursor.insertFragment(QTextDocumentFragment(part))
        if start > 0 and opened.length() == 1 and opened.next().textList() is not None:
            # A list comes in as blocks of its own, after the one opened for it: drop that empty paragraph.
            gap = QTextCursor(self.document())
            gap.setPosition(opened.position() - 1)
            gap.setPosition(opened.position(), QTextCursor.MoveMode.KeepAnchor)
            gap.removeSelectedText()
        self._style_code_blocks(from_position=start)

    def set_plain(self, text: str) -> None:
        self.source_text = text
        self.renders += 1
        self.setPlainText(text)
        self._stable_pos = None

    def append_plain(self, text: str) -> None:
        """Add text at the end without rebuilding the document (streamed reasoning)."""
        if not text:
            return
        self.source_text += text
        self.renders += 1
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)

    def _style_code_blocks(self, from_position: int = 0) -> None:
        """Give fenced code blocks a tinted background and a monospace font, so they read as code."""
        doc = self.document()
        tint = self.palette().color(QPalette.ColorRole.AlternateBase)
        block = doc.findBlock(from_position) if from_position else doc.begin()
        cursor = None
        while block.isValid():
            fmt = block.blockFormat()
            if fmt.hasProperty(QTextBlockFormat.Property.BlockCodeFence) or fmt.nonBreakableLines():
                cursor = cursor or QTextCursor(doc)
                cursor.setPosition(block.position())
                fmt.setBackground(tint)
                fmt.setLeftMargin(8)
                fmt.setRightMargin(8)
                cursor.setBlockFormat(fmt)
            block = block.next()

    def _fit_height(self, size: QSizeF) -> None:
        margins = self.contentsMargins()
        self.setFixedHeight(int(size.height()) + margins.top() + margins.bottom() + 2)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt)
        super().resizeEvent(event)
        self._fit_height(self.document().size())


class Badge(QLabel):
    """A coloured pill: Fits / Tight / Too big."""

    def __init__(self, verdict: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.set_verdict(verdict)

    def set_verdict(self, verdict: str, text: str | None = None) -> None:
        self.verdict = verdict
        colour = badge_colour(verdict)
        self.setText(text or BADGE_TEXT.get(verdict, verdict))
        self.setStyleSheet(f"QLabel {{ color: white; background: {colour.name()}; border-radius: 9px; padding: 1px 9px; font-weight: 600; }}")


def paint_pill(painter: QPainter, rect: QRectF, text: str, colour: QColor, font: QFont) -> None:
    """Draw a badge pill centred vertically in `rect` (used by the library table's delegate)."""
    painter.save()
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    bold = QFont(font)
    bold.setWeight(QFont.Weight.DemiBold)
    painter.setFont(bold)
    fm = painter.fontMetrics()
    w = fm.horizontalAdvance(text) + 18
    h = fm.height() + 4
    pill = QRectF(rect.left() + 6, rect.center().y() - h / 2, w, h)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(colour)
    painter.drawRoundedRect(pill, h / 2, h / 2)
    painter.setPen(QColor("white"))
    painter.drawText(pill, Qt.AlignmentFlag.AlignCenter, text)
    painter.restore()


class StackedBar(QWidget):
    """Horizontal bar of coloured segments against a budget line (memory: weights / KV / state / overhead)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.segments: list[tuple[str, float, QColor]] = []
        self.budget = 0.0
        self.setMinimumHeight(28)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(280, 28)

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(80, 28)

    def set_values(self, segments: list[tuple[str, float, QColor]], budget: float) -> None:
        self.segments = segments
        self.budget = budget
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802
        total = sum(v for _, v, _ in self.segments)
        scale_max = max(total, self.budget, 1.0) * 1.04
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(1, 4, -1, -4)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(self.palette().color(QPalette.ColorRole.Midlight))
        p.drawRoundedRect(r, 5, 5)
        x = r.left()
        p.setClipRect(r)
        for _name, value, colour in self.segments:
            w = r.width() * value / scale_max
            p.setBrush(colour)
            p.drawRect(QRectF(x, r.top(), w, r.height()))
            x += w
        p.setClipping(False)
        if self.budget:
            bx = r.left() + r.width() * self.budget / scale_max
            pen = p.pen()
            p.setPen(self.palette().color(QPalette.ColorRole.WindowText))
            p.drawLine(int(bx), int(r.top() - 4), int(bx), int(r.bottom() + 4))
            p.setPen(pen)
        p.end()


class ElidedLabel(QLabel):
    """A label that elides long text with … instead of stretching its parent."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = text
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802
        self._full = text
        self.setToolTip(text)
        self._elide()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        fm = self.fontMetrics()
        super().setText(fm.elidedText(self._full, Qt.TextElideMode.ElideRight, max(self.width(), 40)))


class CollapsibleFrame(QFrame):
    """A block in a reply that folds: a checkable header with an arrow, and a body its subclass sets
    (the reasoning, a tool call)."""

    body: QWidget

    def __init__(self, object_name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(object_name)
        self.header = QToolButton(self)
        self.header.setObjectName("ReasoningHeader")
        self.header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.header.setCheckable(True)
        self.header.setCursor(Qt.CursorShape.PointingHandCursor)
        self.header.toggled.connect(self.set_expanded)

    def set_expanded(self, expanded: bool) -> None:
        self.header.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        if self.header.isChecked() != expanded:
            self.header.setChecked(expanded)
        self.body.setVisible(expanded)

    @property
    def expanded(self) -> bool:
        return self.body.isVisibleTo(self)
