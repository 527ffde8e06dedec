"""Guard against a Qt binding that drops references to None (PySide6 6.12.0 under Python < 3.12 does, on every
void call, until the interpreter aborts with 'none_dealloc' — a crash minutes into a chat)."""

import sys

from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QLabel, QTextBrowser


def test_void_qt_calls_keep_none_alive(qtbot):
    view = QTextBrowser()
    label = QLabel()
    qtbot.addWidget(view)
    qtbot.addWidget(label)
    cursor = QTextCursor(view.document())
    before = sys.getrefcount(None)
    for i in range(2000):
        label.setText(str(i))
        view.setPlainText("x")
        cursor.insertText("y")
    after = sys.getrefcount(None)
    assert after - before > -100, f"None lost {before - after} references over 6000 void Qt calls"
