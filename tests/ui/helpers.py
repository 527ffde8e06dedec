"""Helpers for UI tests."""

import threading
from contextlib import contextmanager

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from macapp.core.events import AnswerDelta, ReasoningDelta

GREEDY = {"temperature": 0.0, "presence_penalty": 0.0, "top_k": 0, "max_tokens": 64}
NO_END = {"logit_bias": {2: -100.0, 0: -100.0}}  # bias against the tiny model's end tokens: a long reply


def send(chat, qtbot, text, thinking=True):
    """Type `text` in the chat's composer, press Enter, wait for the reply; returns the last message widget."""
    from PySide6.QtCore import Qt

    chat.composer.thinking.setChecked(thinking)
    chat.composer.input.setPlainText(text)
    # The turn's start is a signal emitted inside Enter's handling; `chat.busy` right after the key is not: a
    # short reply can be over by then on a busy machine (the worker ran it all before the bridge attached).
    with qtbot.waitSignal(chat.controller.turn_started, timeout=60_000):
        qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    history_settled(chat, qtbot)  # the sidebar's listing after the turn, read off the GUI thread
    return chat.messages.widgets()[-1]


def history_settled(chat, qtbot) -> None:
    """Wait until the history's worker has delivered everything asked of it (listings, opens, edits)."""
    qtbot.waitUntil(lambda: chat.controller.history_worker.pending == 0, timeout=60_000)


def open_conversation(window_or_chat, qtbot, key) -> None:
    """Open a saved conversation (the window's or the chat page's way) and wait until it is shown (read off the GUI thread)."""
    chat = getattr(window_or_chat, "chat", window_or_chat)
    with qtbot.waitSignal(chat.controller.conversation_opened, timeout=60_000):
        window_or_chat.open_conversation(key)
    history_settled(chat, qtbot)


@contextmanager
def edited(window, qtbot):
    """Waits for the delete, undo or rename asked inside the block (done off the GUI thread, said by signal) and
    the listing that follows it."""
    with qtbot.waitSignal(window.chat.controller.history_edited, timeout=60_000):
        yield
    history_settled(window.chat, qtbot)


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


@contextmanager
def worker_held(engine):
    """Park the engine's worker thread until the block ends, so listeners attach to the next job before it runs
    (a listener runs on the worker, inside the job's emit: what it does to the job happens at an exact point)."""
    gate = threading.Event()
    parked = threading.Event()

    def park(_job):
        parked.set()
        gate.wait(60)

    engine.submit("test-gate", park)
    parked.wait(30)
    try:
        yield
    finally:
        gate.set()


def stop_after_pieces(job, pieces: int) -> None:
    """Stop `job` right after its `pieces`-th text piece (the engine stops before the next token)."""
    seen = [0]

    def listener(event):
        if isinstance(event, (AnswerDelta, ReasoningDelta)):
            seen[0] += 1
            if seen[0] == pieces:
                job.stop()

    job.add_listener(listener)
