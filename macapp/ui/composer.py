"""The input area: text box (Enter sends, Shift+Enter newline), pictures (button, drag and drop, paste), thinking
toggle, settings, Send/Stop."""

from __future__ import annotations

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QKeyEvent
from PySide6.QtWidgets import QCheckBox, QFileDialog, QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from macapp.ui.attachments import IMAGE_FILTER, VIDEO_SUFFIXES, AttachmentStrip

PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".heic") + VIDEO_SUFFIXES


def picture_files(mime: QMimeData) -> list[str]:
    """Local files among dropped / pasted URLs that look like pictures (the core checks them properly)."""
    if not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile().lower().endswith(PICTURE_SUFFIXES)]


def has_pictures(mime: QMimeData) -> bool:
    return mime.hasImage() or bool(picture_files(mime))


class InputBox(QPlainTextEdit):
    submitted = Signal()
    pictures = Signal(object)  # pasted or dropped pictures: the QMimeData that holds them

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Input")
        self.setPlaceholderText("Message the model — Enter sends, Shift+Enter for a new line")
        self.setTabChangesFocus(True)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self._fit()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & (Qt.KeyboardModifier.ShiftModifier | Qt.KeyboardModifier.AltModifier)
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(event)

    # Paste and drop both come through here: pictures go to the composer's strip, text as usual.
    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802
        return has_pictures(source) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802
        if has_pictures(source):
            self.pictures.emit(source)
            return
        super().insertFromMimeData(source)

    def _fit(self, *_args: object) -> None:
        lines = max(1, min(8, int(self.document().size().height())))
        h = self.fontMetrics().lineSpacing() * lines + 14
        self.setFixedHeight(h)


class Composer(QFrame):
    """Emits `send(text)` and `stop()`; `set_busy` flips the Send button into Stop."""

    send = Signal(str)
    stop = Signal()
    settings_requested = Signal()
    thinking_changed = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Composer")
        self.input = InputBox(self)
        self.attachments = AttachmentStrip(self)
        self.attachments.changed.connect(self._update_enabled)
        # Why a file in the strip could not be used: it belongs to that tile and goes with it (× or Send).
        self.picture_error = QLabel(self)
        self.picture_error.setObjectName("Error")
        self.picture_error.setWordWrap(True)
        self.picture_error.hide()
        self.attachments.changed.connect(self._show_picture_errors)
        self.attachments.progress.connect(self._show_progress)
        self.input.pictures.connect(self.add_from_mime)
        self.attach_button = QPushButton("Add picture or video…", self)
        self.attach_button.setFlat(True)
        self.attach_button.setToolTip("Attach pictures or a video to your message (you can also drop or paste them)")
        self.attach_button.clicked.connect(self.choose_pictures)
        self.setAcceptDrops(True)
        self.thinking = QCheckBox("Thinking", self)
        self.thinking.setToolTip("Let the model reason before it answers (applies the model card's sampling presets)")
        self.thinking.toggled.connect(self.thinking_changed)
        self.settings_button = QPushButton("Settings…", self)
        self.settings_button.setFlat(True)
        self.settings_button.clicked.connect(self.settings_requested)
        self.send_button = QPushButton("Send", self)
        self.send_button.setObjectName("Primary")
        self.send_button.setDefault(False)
        self.send_button.clicked.connect(self._on_button)
        self.input.submitted.connect(self._submit)
        self.input.textChanged.connect(self._update_enabled)

        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.thinking)
        row.addWidget(self.attach_button)
        row.addWidget(self.settings_button)
        row.addStretch(1)
        row.addWidget(self.send_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 8, 10, 8)
        lay.setSpacing(4)
        lay.addWidget(self.attachments)
        lay.addWidget(self.picture_error)
        lay.addWidget(self.input)
        lay.addLayout(row)
        self.busy = False
        self.can_send = True
        self._update_enabled()

    # -- pictures
    def choose_pictures(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Add pictures or a video", "", IMAGE_FILTER)
        self.attachments.add_files(paths)

    def add_from_mime(self, mime: QMimeData) -> None:
        files = picture_files(mime)
        if files:
            self.attachments.add_files(files)
        elif mime.hasImage():
            self.attachments.add_qimage(mime.imageData())

    def _show_picture_errors(self) -> None:
        errors = self.attachments.errors()
        self.picture_error.setObjectName("Error")
        self.picture_error.setText("\n".join(errors))
        self.picture_error.setVisible(bool(errors))

    def _show_progress(self, name: str, done: int, total: int) -> None:
        """A video being decoded: which frame (the line goes once its strip is shown)."""
        if self.attachments.errors():
            return
        self.picture_error.setObjectName("Progress")
        self.picture_error.setText(f"Reading {name}: frame {done} of {total}…")
        self.picture_error.setVisible(done < total)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802
        if has_pictures(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        if has_pictures(event.mimeData()):
            self.add_from_mime(event.mimeData())
            event.acceptProposedAction()

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.send_button.setText("Stop" if busy else "Send")
        self._update_enabled()

    def set_can_send(self, ok: bool, reason: str = "") -> None:
        self.can_send = ok
        self.input.setPlaceholderText(reason or "Message the model — Enter sends, Shift+Enter for a new line")
        self._update_enabled()

    def _update_enabled(self) -> None:
        if self.busy:
            self.send_button.setEnabled(True)
        else:
            ready = not self.attachments.pending  # a picture still being read goes with this message
            self.send_button.setEnabled(self.can_send and ready and bool(self.input.toPlainText().strip()))

    def _on_button(self) -> None:
        if self.busy:
            self.stop.emit()
        else:
            self._submit()

    def _submit(self) -> None:
        text = self.input.toPlainText().strip()
        if self.busy or not self.can_send or not text or self.attachments.pending:
            return
        self.input.clear()
        self.send.emit(text)
