"""The window's pages: their order, their titles and the keys that open them (sidebar, View menu, hints in text)."""

from __future__ import annotations

from PySide6.QtGui import QKeySequence

LIBRARY, CHAT, SERVER = 0, 1, 2
TITLES = ("Models", "Chat", "Local Server")
KEYS = ("Ctrl+1", "Ctrl+2", "Ctrl+3")  # Qt's Ctrl is ⌘ on macOS


def key_text(page: int) -> str:
    """The page's shortcut as this platform writes it: '⌘1' on macOS, 'Ctrl+1' elsewhere."""
    return QKeySequence(KEYS[page]).toString(QKeySequence.SequenceFormat.NativeText)
