"""Helpers for UI tests."""

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox


def answer_next_box(button_text: str) -> dict:
    """Click `button_text` in the next modal message box (it runs its own event loop); returns what it said."""
    seen: dict = {}

    def click():
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(20, click)
            return
        seen["text"] = box.text()
        for b in box.buttons():
            if b.text().replace("&", "") == button_text:
                b.click()
                return
        box.close()
        seen["error"] = [b.text() for b in box.buttons()]

    QTimer.singleShot(0, click)
    return seen
