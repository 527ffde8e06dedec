"""The status bar: this Mac's chip, memory and GPU budget, and the app's own memory use as it changes."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QPushButton, QStatusBar, QWidget

from macapp.core.hardware import MachineProfile, machine_warning
from macapp.core.memory import app_memory, format_bytes


UNDO_TEXT_WIDTH = 300  # px
MESSAGE_GAP = 16  # px between the status bar's items, with its margins


class StatusArea(QStatusBar):
    def __init__(self, parent: QWidget | None = None, poll_ms: int = 2000) -> None:
        super().__init__(parent)
        self.setSizeGripEnabled(False)
        self.machine_label = QLabel(self)
        self.budget_label = QLabel(self)
        self.app_label = QLabel(self)
        self.model_label = QLabel(self)
        self.undo_label = QLabel(self)
        self.undo_button = QPushButton("Undo", self)
        self.undo_button.setObjectName("UndoButton")
        self.undo_button.setFlat(True)
        self.undo_button.clicked.connect(self._undo)
        self._undo_action: Callable[[], object] | None = None
        self.notice_label = QLabel(self)
        self.notice_label.setObjectName("Warning")
        self.notice_label.setWordWrap(False)
        # QStatusBar paints a message on one line left of the figures and cuts what does not fit: this label
        # wraps instead, and the figures that step aside for Undo step aside for a message too.
        self.message_label = QLabel(self)
        self.message_label.setObjectName("StatusMessage")
        self.message_label.setWordWrap(True)
        self.message_label.setTextFormat(Qt.TextFormat.PlainText)
        self.message_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._message_timer = QTimer(self)
        self._message_timer.setSingleShot(True)
        self._message_timer.timeout.connect(self.clearMessage)
        self.addWidget(self.message_label, 1)
        self.addWidget(self.notice_label, 1)
        for w in (self.undo_label, self.undo_button, self.model_label, self.machine_label, self.budget_label, self.app_label):
            self.addPermanentWidget(w)
        self.notice_label.hide()
        self.message_label.hide()
        self._notice = False
        self.clear_undo()
        self.model_label.setText("No model loaded")
        self._timer = QTimer(self)
        self._timer.setInterval(poll_ms)
        self._timer.timeout.connect(self.refresh_memory)
        self._timer.start()
        self.refresh_memory()

    def set_machine(self, machine: MachineProfile) -> None:
        ram_gb = machine.memory_bytes / 1024**3  # as Apple labels it: a "24 GB" Mac has 24 GiB
        what_if = "what" in machine.source.lower()
        prefix = "What if: " if what_if else ""
        warning = machine_warning(machine)  # a what-if past what Apple sells with the chip: shown, not refused
        self.machine_label.setText(f"{prefix}{machine.chip} · {ram_gb:.0f} GB memory{' (no such Mac)' if warning else ''}")
        self.machine_label.setObjectName("Warning" if warning else "")
        self.machine_label.style().polish(self.machine_label)
        self.budget_label.setText(f"GPU budget {format_bytes(machine.budget_bytes)}")
        src = machine.source
        self.machine_label.setToolTip(warning[0].upper() + warning[1:] if warning else f"Detected from: {src}" if src else "")

    def show_notice(self, text: str) -> None:
        """A lasting warning (e.g. about the chat history); the whole text is in the tooltip."""
        first = text.split(". ")[0].rstrip(".")
        self.notice_label.setText(f"⚠ {first}")
        self.notice_label.setToolTip(text)
        self._notice = True
        self._arrange()

    def showMessage(self, text: str, timeout: int | None = 0) -> None:  # noqa: N802  QStatusBar's name: every caller gets the whole text shown
        """A passing message, whole (wrapped if need be), for `timeout` ms (0: until the next one or clearMessage)."""
        self.message_label.setText(text)
        if timeout and timeout > 0 and text:
            self._message_timer.start(timeout)
        else:
            self._message_timer.stop()
        self._arrange()
        self.messageChanged.emit(text)

    def clearMessage(self) -> None:  # noqa: N802
        if self.message_label.text():
            self.showMessage("")

    def currentMessage(self) -> str:  # noqa: N802
        return self.message_label.text()

    def _arrange(self) -> None:
        """A message takes the place of the lasting notice, and of the figures that also step aside for Undo when it
        would not fit on one line beside them (it wraps if it still does not)."""
        text = self.message_label.text()
        self.message_label.setVisible(bool(text))
        self.notice_label.setVisible(self._notice and not text)
        yielding = not self.undo_button.isHidden() or (bool(text) and not self._fits_beside_figures(text))
        for w in self._yield_to_undo():
            w.setVisible(not yielding)

    def _fits_beside_figures(self, text: str) -> bool:
        beside = [self.model_label, self.machine_label, *self._yield_to_undo()]
        taken = sum(w.sizeHint().width() + MESSAGE_GAP for w in beside)
        return self.message_label.fontMetrics().horizontalAdvance(text) + taken <= self.width() - MESSAGE_GAP

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        if self.message_label.text():
            self._arrange()

    def offer_undo(self, text: str, action: Callable[[], object]) -> None:
        """Show `text` with an Undo button that calls `action` (the caller withdraws it with clear_undo)."""
        self._undo_action = action
        # Elided to a fixed width: a long conversation title must not push the machine's figures off the bar.
        metrics = self.undo_label.fontMetrics()
        self.undo_label.setText(metrics.elidedText(text, Qt.TextElideMode.ElideMiddle, UNDO_TEXT_WIDTH))
        self.undo_label.setToolTip(text)
        self.undo_label.show()
        self.undo_button.show()
        self._arrange()  # room for Undo without widening the window past the screen

    def clear_undo(self) -> None:
        self._undo_action = None
        self.undo_label.hide()
        self.undo_button.hide()
        self._arrange()

    def _yield_to_undo(self) -> tuple[QLabel, ...]:
        """The figures that step aside while Undo is offered (for its 10 s); the model and the chip stay."""
        return (self.budget_label, self.app_label)

    def _undo(self) -> None:
        action, self._undo_action = self._undo_action, None
        if action is not None:
            action()

    def set_model(self, text: str) -> None:
        self.model_label.setText(text)

    def refresh_memory(self) -> None:
        mem = app_memory()
        if mem.mlx_active_bytes:
            self.app_label.setText(f"Qwen Desk uses {format_bytes(mem.mlx_active_bytes)} (model + cache) · {format_bytes(mem.rss_bytes)} in all")
        else:
            self.app_label.setText(f"Qwen Desk uses {format_bytes(mem.rss_bytes)}")
        self.app_label.setToolTip(
            f"MLX buffers (weights and caches) and the whole process's resident memory; peak {format_bytes(mem.mlx_peak_bytes)}"
            if mem.mlx_peak_bytes
            else "The whole process's resident memory"
        )
